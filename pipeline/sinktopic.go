package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/flowd-io/flowd/internal/clientcore"
	"github.com/flowd-io/flowd/protocol"
)

// ErrNoSinkTopic: a topic sink's topic does not exist and its definition does not have it
// created (sink.create_queues). It wraps ErrUnavailable.
var ErrNoSinkTopic = fmt.Errorf("%w: no such sink topic", ErrUnavailable)

// ensureTopic makes sure a topic sink's topic exists before the pipeline starts, creating
// it when the definition says so. Left to itself, the producer would send to a topic that
// does not exist through the auto-create route (TBW102), and a mistyped topic would become
// a new topic of the broker's default queue count, its messages out of everybody's sight.
func ensureTopic(ctx context.Context, ns []string, def SinkDefinition, log *slog.Logger) (err error) {
	cl, err := clientcore.New(clientcore.Options{NameServers: ns, Logger: log})
	if err != nil {
		return fmt.Errorf("check topic %q: %w", def.Topic, err)
	}
	defer func() {
		if cerr := cl.Close(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, fmt.Errorf("check topic %q: %w", def.Topic, cerr))
		}
	}()
	_, err = cl.UpdateRoute(ctx, def.Topic)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, clientcore.ErrTopicNotExist):
		return fmt.Errorf("check topic %q: %w", def.Topic, err)
	case def.CreateQueues == 0:
		return fmt.Errorf("%w: topic %q does not exist (name servers %s); create it first, or set sink.create_queues: N to have the pipeline create it with N queues",
			ErrNoSinkTopic, def.Topic, strings.Join(ns, ","))
	}
	brokers, err := masterBrokers(ctx, cl, ns)
	if err != nil {
		return fmt.Errorf("create topic %q: %w", def.Topic, err)
	}
	n := int32(def.CreateQueues)
	h := protocol.CreateTopicRequestHeader{Topic: def.Topic, ReadQueueNums: n, WriteQueueNums: n, Perm: protocol.PermRead | protocol.PermWrite}
	for _, addr := range brokers {
		if _, err := cl.InvokeOK(ctx, addr, protocol.NewRequestWith(protocol.UpdateAndCreateTopic, &h, nil)); err != nil {
			return fmt.Errorf("create topic %q: %w", def.Topic, err)
		}
	}
	log.Info("sink topic created", "topic", def.Topic, "queues", def.CreateQueues, "brokers", strings.Join(brokers, ","))
	return nil
}

// masterBrokers asks the name servers, in turn until one answers, for the master address of
// every broker of their cluster.
func masterBrokers(ctx context.Context, cl *clientcore.Client, ns []string) ([]string, error) {
	var errs []error
	for _, entry := range ns {
		for _, addr := range strings.Split(entry, ";") {
			if addr = strings.TrimSpace(addr); addr == "" {
				continue
			}
			resp, err := cl.InvokeOK(ctx, addr, protocol.NewRequest(protocol.GetBrokerClusterInfo, nil, nil))
			if err != nil {
				errs = append(errs, err)
				if ctx.Err() != nil {
					return nil, errors.Join(errs...)
				}
				continue
			}
			info, err := protocol.DecodeClusterInfo(resp.Body)
			if err != nil {
				return nil, fmt.Errorf("name server %s: %w", addr, err)
			}
			var out []string
			for _, bd := range info.BrokerAddrTable {
				if a := bd.BrokerAddrs[protocol.MasterID]; a != "" {
					out = append(out, a)
				}
			}
			if len(out) == 0 {
				return nil, fmt.Errorf("name server %s knows no broker", addr)
			}
			slices.Sort(out)
			return out, nil
		}
	}
	return nil, fmt.Errorf("no name server answered: %w", errors.Join(errs...))
}
