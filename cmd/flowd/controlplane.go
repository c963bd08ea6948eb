package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/flowd-io/flowd/broker"
	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/control"
)

// controlPlane is the NATS connection, the event publisher and the command service. The
// daemon has none when NATS is off.
type controlPlane struct {
	n   *control.NATS
	pub *control.Publisher
	cfg control.ServiceConfig

	mu  sync.Mutex // guards svc: a reload replaces it while the console reads it
	svc *control.Service
}

// service is the command service serving now, or nil (the console answers 503 then).
func (c *controlPlane) service() *control.Service {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.svc
}

func (c *controlPlane) setService(svc *control.Service) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.svc = svc
}

// natsConfig maps the nats section onto control.NATSConfig, reading users_file.
func natsConfig(c config.Config, log *slog.Logger) (control.NATSConfig, error) {
	nc := control.NATSConfig{
		URLs: c.NATS.URLs, CredsFile: c.NATS.Creds, NKeySeedFile: c.NATS.NKey, Token: c.NATS.Token,
		TLSCert: c.NATS.TLSCert, TLSKey: c.NATS.TLSKey, TLSCA: c.NATS.TLSCA,
		Listen: c.NATS.Listen, StoreDir: filepath.Join(c.DataDir, "nats"), Logger: log,
	}
	nc.ServerName, nc.Cluster = natsCluster(c)
	for _, u := range c.NATS.Users {
		nc.Users = append(nc.Users, control.NATSUser{Name: u.Name, Password: u.Password, Role: control.Role(u.Role)})
	}
	if f := c.NATS.UsersFile; f != "" {
		raw, err := os.ReadFile(f)
		if err != nil {
			return nc, fmt.Errorf("serve: nats.users_file (--nats-users): %w", err)
		}
		var users []struct{ Name, Password, Role string }
		if err := json.Unmarshal(raw, &users); err != nil {
			return nc, fmt.Errorf("serve: nats.users_file (--nats-users) %s: %w", f, err)
		}
		for _, u := range users {
			nc.Users = append(nc.Users, control.NATSUser{Name: u.Name, Password: u.Password, Role: control.Role(u.Role)})
		}
	}
	return nc, nil
}

func startControlPlane(ctx context.Context, c config.Config, cfg broker.Config, b *broker.Broker, ph *pluginHost, log *slog.Logger) (*controlPlane, error) {
	nc, err := natsConfig(c, log)
	if err != nil {
		return nil, err
	}
	n, err := control.Open(ctx, nc)
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	ec := control.EventsConfig{
		Buffer: c.NATS.Events.Buffer, OffsetInterval: c.NATS.Events.OffsetInterval, Stream: c.NATS.Events.Stream,
		StreamMaxAge: c.NATS.Events.MaxAge, StreamMaxBytes: int64(c.NATS.Events.MaxBytes),
		Cluster: cfg.Cluster, Node: cfg.BrokerName, Version: version, Logger: log,
	}
	pub, err := control.NewPublisher(ctx, n, b, ec)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("serve: %w", err), n.Close(context.Background()))
	}
	ph.setSink(pub.Plugin)
	sc := control.ServiceConfig{Cluster: cfg.Cluster, Node: cfg.BrokerName, Logger: log, Plugins: ph.reg,
		PluginEvents: pub.Plugin, Disabled: c.NATS.Disabled, NATS: n}
	return &controlPlane{n: n, pub: pub, cfg: sc}, nil
}

// started announces the broker and starts taking commands, once the broker serves.
func (c *controlPlane) started(ctx context.Context, b *broker.Broker) error {
	c.pub.Started()
	svc, err := control.StartService(ctx, c.n.Conn(), b, c.cfg)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	c.setService(svc)
	return nil
}

// setDisabled restarts the command service with another list of disabled commands. A list
// the service refuses (an unknown command) leaves the old one serving. Commands arriving
// during the switch get no responder.
func (c *controlPlane) setDisabled(ctx context.Context, b *broker.Broker, disabled []string) error {
	cur := c.service()
	if cur == nil { // a restart failed before: nothing serves to stop
		return nil
	}
	if err := cur.Stop(); err != nil {
		return fmt.Errorf("stop command service: %w", err)
	}
	next := c.cfg
	next.Disabled = disabled
	svc, err := control.StartService(ctx, c.n.Conn(), b, next)
	if err != nil {
		old, oerr := control.StartService(ctx, c.n.Conn(), b, c.cfg)
		if oerr != nil {
			c.setService(nil)
			return errors.Join(err, fmt.Errorf("restart command service: %w", oerr))
		}
		c.setService(old)
		return err
	}
	c.cfg = next
	c.setService(svc)
	return nil
}

// stopping announces the stop and stops taking commands before the broker shuts down.
func (c *controlPlane) stopping() error {
	c.pub.Stopping()
	svc := c.service()
	if svc == nil {
		return nil
	}
	return svc.Stop()
}

func (c *controlPlane) url() string { return c.n.ListenURL() }

// close flushes the publisher and closes NATS, once the broker has shut down.
func (c *controlPlane) close(ctx context.Context) error {
	return errors.Join(c.pub.Close(ctx), c.n.Close(ctx))
}
