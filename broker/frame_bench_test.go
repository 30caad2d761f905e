package broker

import (
	"fmt"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// The content header's size is checked for every message before its
// publish.
func BenchmarkContentHeaderSize(b *testing.B) {
	for _, n := range []int{0, 8, 64} {
		b.Run(fmt.Sprintf("headers%d", n), func(b *testing.B) {
			headers := amqp.Table{}
			for i := range n {
				headers[fmt.Sprintf("x-header-%02d", i)] = fmt.Sprintf("value-%02d", i)
			}
			pub := amqp.Publishing{
				ContentType: "application/json", MessageId: "order-00000001-created", Type: "order.created",
				DeliveryMode: amqp.Persistent, Headers: headers,
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := checkContentHeader(pub, 131072); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
