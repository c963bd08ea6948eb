package producer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/producer"
)

func Example() {
	ctx := context.Background()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// A broker for the example; the flowd daemon runs one in production.
	dir, _ := os.MkdirTemp("", "flowd-example-")
	defer os.RemoveAll(dir)
	b, err := broker.New(broker.Config{DataDir: dir, Listen: "127.0.0.1:0", NamesrvListen: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		panic(err)
	}
	_ = b.Start()
	defer b.Shutdown(ctx)

	p, err := producer.New("order-service",
		producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr())),
		producer.WithQueueSelector(producer.HashByKey()), // one queue per order: per-order sequence
		producer.WithClientOptions(client.WithLogger(quiet)),
	)
	if err != nil {
		panic(err)
	}
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Close(ctx)

	res, err := p.Send(ctx, &producer.Message{Topic: "orders", Tags: "created", Keys: []string{"order-42"}, Body: []byte(`{"id":42}`)})
	if err != nil {
		panic(err)
	}
	fmt.Println(res.Status, len(res.MsgID), "hex digits of id")

	var wg sync.WaitGroup
	wg.Add(1)
	p.SendAsync(ctx, &producer.Message{Topic: "orders", Tags: "paid", Keys: []string{"order-42"}, Body: []byte(`{"id":42}`)},
		func(r producer.SendResult, err error) {
			defer wg.Done()
			fmt.Println("async:", r.Status, err, "same queue:", r.Queue == res.Queue)
		})
	wg.Wait()

	batch, err := p.SendBatch(ctx,
		&producer.Message{Topic: "audit", Body: []byte("a")},
		&producer.Message{Topic: "audit", Body: []byte("b")},
	)
	if err != nil {
		fmt.Println("batch:", err)
		return
	}
	fmt.Println("batch:", len(batch), "results,", batch[0].Status, "at offsets", batch[0].QueueOffset, batch[1].QueueOffset)
	// Output:
	// SEND_OK 32 hex digits of id
	// async: SEND_OK <nil> same queue: true
	// batch: 2 results, SEND_OK at offsets 0 1
}
