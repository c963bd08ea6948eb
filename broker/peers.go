package broker

import (
	"cmp"
	"slices"

	"github.com/flowd-io/flowd/protocol"
)

// Peers reports the other brokers of a cluster to the name service (Config.Peers). The
// broker knows nothing of how they are found (the cluster package keeps them in NATS); it
// only merges what Peers reports into its own answers. Implementations must be safe for
// concurrent use and must not block: they are called on the request path.
type Peers interface {
	// TopicRoute returns the queue and broker data of topic on the live brokers other than
	// this one, or nothing when no other broker has it.
	TopicRoute(topic string) ([]protocol.QueueData, []protocol.BrokerData)
	// Brokers returns the live brokers other than this one.
	Brokers() []protocol.BrokerData
	// Topics returns the cluster's shared topics, which every live broker has or is about
	// to have: the name service's topic lists answer for the whole cluster with them.
	Topics() []string
}

// peerRoute adds the peers' queue and broker data of a topic to route, after this broker's
// own, sorted by broker name so that every node answers alike. Data naming this broker are
// skipped: this broker's own table is the truth about itself.
func (b *Broker) peerRoute(route *protocol.TopicRouteData, topic string) {
	queues, brokers := b.cfg.Peers.TopicRoute(topic)
	for _, q := range queues {
		if q.BrokerName != b.cfg.BrokerName {
			route.QueueDatas = append(route.QueueDatas, q)
		}
	}
	for _, bd := range brokers {
		if bd.BrokerName != b.cfg.BrokerName {
			route.BrokerDatas = append(route.BrokerDatas, bd)
		}
	}
	own := 0
	if len(route.QueueDatas) > 0 && route.QueueDatas[0].BrokerName == b.cfg.BrokerName {
		own = 1
	}
	slices.SortFunc(route.QueueDatas[own:], func(x, y protocol.QueueData) int { return cmp.Compare(x.BrokerName, y.BrokerName) })
	own = 0
	if len(route.BrokerDatas) > 0 && route.BrokerDatas[0].BrokerName == b.cfg.BrokerName {
		own = 1
	}
	slices.SortFunc(route.BrokerDatas[own:], func(x, y protocol.BrokerData) int { return cmp.Compare(x.BrokerName, y.BrokerName) })
}
