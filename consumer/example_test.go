package consumer_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer"
	"github.com/flowd-io/flowd/producer"
)

// exampleBroker runs a broker on free loopback ports, as the flowd daemon would.
func exampleBroker() (*broker.Broker, func()) {
	dir, err := os.MkdirTemp("", "flowd-example-")
	if err != nil {
		panic(err)
	}
	b, err := broker.New(broker.Config{
		DataDir:       dir,
		Listen:        "127.0.0.1:0",
		NamesrvListen: "127.0.0.1:0",
		Logger:        slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	if err := b.Start(); err != nil {
		panic(err)
	}
	return b, func() {
		_ = b.Shutdown(context.Background())
		_ = os.RemoveAll(dir)
	}
}

func Example() {
	ctx := context.Background()
	b, stop := exampleBroker()
	defer stop()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	// A producer creates the topic on its first send, with one queue here so that the
	// example's output is in order.
	p, err := producer.New("order-service", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr())),
		producer.WithDefaultTopicQueues(1), producer.WithClientOptions(client.WithLogger(quiet)))
	if err != nil {
		panic(err)
	}
	if err := p.Start(ctx); err != nil {
		panic(err)
	}
	defer p.Close(ctx)
	for i, tag := range []string{"created", "shipped", "paid"} {
		msg := &producer.Message{Topic: "orders", Tags: tag, Keys: []string{fmt.Sprint("order-", i)}, Body: []byte(fmt.Sprintf("order %d %s", i, tag))}
		if _, err := p.Send(ctx, msg); err != nil {
			panic(err)
		}
	}

	c, err := consumer.NewLitePull("order-audit",
		consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr())),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst),
		consumer.WithClientOptions(client.WithLogger(quiet)),
	)
	if err != nil {
		panic(err)
	}
	if err := c.Subscribe("orders", "created || paid"); err != nil {
		panic(err)
	}
	if err := c.Start(ctx); err != nil {
		panic(err)
	}
	defer c.Close(ctx)

	for received := 0; received < 2; {
		msgs, err := c.Poll(ctx)
		if err != nil {
			panic(err)
		}
		for _, m := range msgs {
			fmt.Printf("%s: %s (tag %s, key %s)\n", m.Queue.Topic, m.Body, m.Tags, m.Keys[0])
			received++
		}
	}
	if err := c.Commit(ctx); err != nil {
		panic(err)
	}
	off, _ := c.Committed(ctx, c.Assignment()[0])
	fmt.Println("committed offset:", off)
	// Output:
	// orders: order 0 created (tag created, key order-0)
	// orders: order 2 paid (tag paid, key order-2)
	// committed offset: 3
}

func ExampleLitePull_Assign() {
	ctx := context.Background()
	b, stop := exampleBroker()
	defer stop()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	p, _ := producer.New("clicks", producer.WithClientOptions(client.WithNameServers(b.NamesrvAddr()), client.WithLogger(quiet)), producer.WithDefaultTopicQueues(1))
	_ = p.Start(ctx)
	defer p.Close(ctx)
	for i := range 5 {
		_, _ = p.Send(ctx, &producer.Message{Topic: "clicks", Body: []byte(fmt.Sprint("click ", i))})
	}

	c, _ := consumer.NewLitePull("replayer", consumer.WithClientOptions(client.WithNameServers(b.NamesrvAddr())),
		consumer.WithConsumeFrom(consumer.ConsumeFromFirst), consumer.WithClientOptions(client.WithLogger(quiet)))
	_ = c.Start(ctx)
	defer c.Close(ctx)
	queues, err := c.FetchMessageQueues(ctx, "clicks")
	if err != nil {
		panic(err)
	}
	_ = c.Assign(queues) // read every queue ourselves, no group sharing
	// A Poll returns what one pull brought, which may be fewer messages than were sent (the
	// broker may not have made them all readable yet): poll until all have come.
	pollUntil := func(n int) []*consumer.Message {
		var out []*consumer.Message
		for len(out) < n {
			msgs, err := c.Poll(ctx)
			if err != nil {
				panic(err)
			}
			out = append(out, msgs...)
		}
		return out
	}
	msgs := pollUntil(5)
	fmt.Println(len(msgs), "messages, the last at offset", msgs[len(msgs)-1].QueueOffset)

	// Replay from offset 3.
	if err := c.Seek(ctx, queues[0], 3); err != nil {
		panic(err)
	}
	for _, m := range pollUntil(2) {
		fmt.Println(string(m.Body))
	}
	// Output:
	// 5 messages, the last at offset 4
	// click 3
	// click 4
}
