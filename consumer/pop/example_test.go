package pop_test

import (
	"context"
	"log"
	"time"

	"github.com/flowd-io/flowd/client"
	"github.com/flowd-io/flowd/consumer/pop"
)

// Receive batches, handle them, acknowledge them in one request per broker; a message that
// cannot be handled now is made visible again at once for another receive.
func Example() {
	c, err := pop.New("order-readers", "orders",
		pop.WithClientOptions(client.WithNameServers("127.0.0.1:9876")),
		pop.WithInvisibleDuration(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(context.Background())
	ctx := context.Background()
	for {
		msgs, err := c.Receive(ctx, pop.MaxBatch)
		if err != nil {
			log.Fatal(err)
		}
		var done []pop.Message
		for _, m := range msgs {
			if handle(m) {
				done = append(done, m)
			} else if _, err := c.ChangeInvisibleDuration(ctx, m, 0); err != nil {
				log.Print(err) // it comes back once its invisibility passes anyway
			}
		}
		if err := c.Ack(ctx, done...); err != nil {
			log.Print(err) // pop.ErrNotInFlight: redelivered meanwhile, handled twice
		}
	}
}

func handle(m pop.Message) bool { return len(m.Body) > 0 }
