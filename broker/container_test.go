package broker

// The container suite: this package's tests again against each RabbitMQ
// of testenv.RabbitImages (the last 3.x and a 4.x), each started with
// testcontainers-go, so that the publisher's confirms, returns, frames,
// reconnects and failovers are tested on both series. It needs a Docker
// engine and skips, saying so, where there is none (fails under
// OUTBOX_TEST_DOCKER=required).

import (
	"testing"

	"github.com/outboxrelay/outbox/internal/testenv"
)

func TestContainerRabbitMQVersions(t *testing.T) {
	t.Parallel()
	for _, image := range testenv.RabbitImages {
		// One at a time: each runs the whole package.
		t.Run(image, func(t *testing.T) {
			amqpURL := testenv.RabbitMQOf(t, image)
			// The tests read their broker from OUTBOX_TEST_AMQP_URL; the
			// run must not start this test again.
			testenv.GoTest(t, ".", []string{testenv.EnvAMQPURL + "=" + amqpURL}, "-skip", "^TestContainer", ".")
		})
	}
}
