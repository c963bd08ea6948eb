package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/flowd-io/flowd/cluster"
	"github.com/flowd-io/flowd/config"
	"github.com/flowd-io/flowd/control"
	"github.com/flowd-io/flowd/pipeline"
)

// sharedPipelines is what pipeline.create and pipeline.delete work on: the pipelines
// bucket (cluster.PipelineStore) of the NATS the node is on, checked against the
// configuration file's pipelines of this node. In a cluster every node watches the bucket
// and runs what it holds; a node alone keeps the bucket in its own JetStream, under its
// data directory, so the pipelines it was given outlive a restart all the same.
type sharedPipelines struct {
	store *cluster.PipelineStore
	host  *pipelineHost
}

var _ control.PipelineDefinitions = (*sharedPipelines)(nil)

// kindError is an error with the text of err that also wraps kind (a sentinel of package
// pipeline, which the control plane maps to a reply code).
type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// Create refuses a name of the configuration file, then stores def (cluster.PipelineStore
// validates it and refuses a name the bucket holds).
func (s *sharedPipelines) Create(ctx context.Context, def pipeline.Definition) error {
	if def.Name != "" && s.host.inFile(def.Name) {
		return &kindError{pipeline.ErrExists, fmt.Errorf("pipeline %q is defined in the configuration file of node %s (pipelines:): a created pipeline needs a name of its own", def.Name, s.host.node)}
	}
	err := s.store.Create(ctx, def)
	if errors.Is(err, cluster.ErrPipelineExists) {
		return &kindError{pipeline.ErrExists, err}
	}
	return err
}

// Delete removes name from the bucket; a name only the configuration file has is not
// found, with a word on where it is.
func (s *sharedPipelines) Delete(ctx context.Context, name string) error {
	err := s.store.Delete(ctx, name)
	if !errors.Is(err, cluster.ErrPipelineNotFound) {
		return err
	}
	if s.host.inFile(name) {
		err = fmt.Errorf("pipeline %q was not created over NATS: it is defined in the configuration file of node %s; remove it there", name, s.host.node)
	}
	return &kindError{pipeline.ErrNotFound, err}
}

// openSharedPipelines opens the pipelines bucket on the control plane's connection, with
// the replicas of the cluster's other buckets, and reports its definitions to the host.
// It pushes the store's Close, which stops the watch.
func (d *built) openSharedPipelines(ctx context.Context, c config.Config, cl *closers, log *slog.Logger) (*sharedPipelines, error) {
	store, err := cluster.OpenPipelines(ctx, cluster.PipelineOptions{
		Conn:     d.cp.n.Conn(),
		Replicas: routedReplicas(c),
		Node:     c.BrokerName,
		Logger:   log.With("component", "pipeline"),
		OnChange: d.pl.setShared,
	})
	if err != nil {
		return nil, err
	}
	cl.push("pipeline definitions", noErr(store.Close))
	return &sharedPipelines{store: store, host: d.pl}, nil
}

// readDefinition reads a definition file, YAML or JSON (JSON is YAML), into the JSON the
// control plane decodes: its fields are checked there, by the one set of rules.
func readDefinition(path string, stdin io.Reader) (json.RawMessage, error) {
	var raw []byte
	var err error
	if path == "-" {
		raw, err = io.ReadAll(stdin)
	} else {
		raw, err = os.ReadFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("pipeline create: %w", err)
	}
	var v any
	if err := yaml.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("pipeline create: %s: %w", path, err)
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, fmt.Errorf("pipeline create: %s: a definition is a mapping (name, topics, sink, ...), not %T", path, v)
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("pipeline create: %s: %w", path, err)
	}
	return out, nil
}

// pipelineDefineCommands are pipeline create and pipeline delete.
func pipelineDefineCommands(o *clientOpts) []*cobra.Command {
	var file string
	create := &cobra.Command{
		Use:   "create -f FILE",
		Short: "Create a pipeline from a definition file (YAML or JSON; - for stdin): every node of the cluster runs it",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if file == "" {
				return errors.New("pipeline create: -f FILE is required (a definition in YAML or JSON, as an entry of pipelines: in the configuration file)")
			}
			def, err := readDefinition(file, cmd.InOrStdin())
			if err != nil {
				return err
			}
			req := struct {
				Definition json.RawMessage `json:"definition"`
			}{def}
			return call(cmd, o, "pipeline.create", req, func(w io.Writer, r *control.PipelineDefinitionReply) {
				fmt.Fprintf(w, "pipeline %s created (through %s); every node holding it starts it: see flowd pipeline list\n", r.Definition.Name, r.Node)
			})
		},
	}
	create.Flags().StringVarP(&file, "file", "f", "", "the definition file, YAML or JSON; - reads stdin")
	del := &cobra.Command{
		Use: "delete NAME", Short: "Delete a created pipeline: every node stops it, draining", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return call(cmd, o, "pipeline.delete", control.PipelineRequest{Name: args[0]}, func(w io.Writer, r *control.PipelineDeleteReply) {
				fmt.Fprintf(w, "pipeline %s deleted (through %s); every node stops it\n", r.Name, r.Node)
			})
		},
	}
	return []*cobra.Command{create, del}
}
