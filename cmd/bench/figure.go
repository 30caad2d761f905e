package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Results is everything one run measured; it is written as bench.json.
// The run's header (when, where, with what settings) and its stage times
// and targets are fields; every figure belongs to the stage that measures
// it (stage.figures) and is kept under its JSON key, so that adding a
// stage adds no field here.
type Results struct {
	StartedAt    time.Time     `json:"startedAt"`
	TotalSeconds float64       `json:"totalSeconds"`
	Machine      Machine       `json:"machine"`
	Config       ConfigSummary `json:"config"`
	Stages       []StageTime   `json:"stages"`
	Targets      []Target      `json:"targets"`

	figures map[string]any // by JSON key
}

// A figure is one top-level entry of bench.json: its key and its type.
// Stages declare theirs as package variables and read and write them in
// a Results with get and set.
type figure[T any] struct{ key string }

// anyFigure is a figure of any type, as a stage lists the ones it owns.
type anyFigure interface {
	jsonKey() string
	decode(raw json.RawMessage) (any, error)
}

func (f figure[T]) jsonKey() string { return f.key }

func (f figure[T]) decode(raw json.RawMessage) (any, error) {
	var v T
	err := json.Unmarshal(raw, &v)
	return v, err
}

// get returns the figure, if the run measured it.
func (f figure[T]) get(r *Results) (T, bool) {
	v, ok := r.figures[f.key].(T)
	return v, ok
}

// value returns the figure, or T's zero value if the run did not measure it.
func (f figure[T]) value(r *Results) T {
	v, _ := f.get(r)
	return v
}

func (f figure[T]) set(r *Results, v T) {
	if r.figures == nil {
		r.figures = map[string]any{}
	}
	r.figures[f.key] = v
}

// figuresOf lists the figures of stages, in their order, each once
// (the slow-database stages share one).
func figuresOf(stages []stage) []anyFigure {
	var out []anyFigure
	var seen []string
	for _, s := range stages {
		for _, f := range s.figures {
			if !slices.Contains(seen, f.jsonKey()) {
				seen = append(seen, f.jsonKey())
				out = append(out, f)
			}
		}
	}
	return out
}

// resultsFields is Results without its methods: its fields as JSON knows them.
type resultsFields Results

// MarshalJSON writes the header, then the figures in the order of the
// stages that own them, then the stage times and targets.
func (r Results) MarshalJSON() ([]byte, error) {
	return r.marshal(stages())
}

func (r Results) marshal(stages []stage) ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	put := func(key string, v any) error {
		data, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if buf.Len() > 1 {
			buf.WriteByte(',')
		}
		fmt.Fprintf(&buf, "%q:", key)
		buf.Write(data)
		return nil
	}
	type entry struct {
		key string
		v   any
	}
	entries := []entry{{"startedAt", r.StartedAt}, {"totalSeconds", r.TotalSeconds}, {"machine", r.Machine}, {"config", r.Config}}
	for _, f := range figuresOf(stages) {
		if v, ok := r.figures[f.jsonKey()]; ok {
			entries = append(entries, entry{f.jsonKey(), v})
		}
	}
	entries = append(entries, entry{"stages", r.Stages}, entry{"targets", r.Targets})
	for _, f := range entries {
		if err := put(f.key, f.v); err != nil {
			return nil, err
		}
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// UnmarshalJSON reads the header and every figure a stage owns; a figure
// that is absent or null was not measured.
func (r *Results) UnmarshalJSON(data []byte) error {
	return r.unmarshal(data, stages())
}

func (r *Results) unmarshal(data []byte, stages []stage) error {
	if err := json.Unmarshal(data, (*resultsFields)(r)); err != nil {
		return err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	r.figures = map[string]any{}
	for _, f := range figuresOf(stages) {
		v, ok := raw[f.jsonKey()]
		if !ok || string(v) == "null" {
			continue
		}
		x, err := f.decode(v)
		if err != nil {
			return fmt.Errorf("%s: %w", f.jsonKey(), err)
		}
		r.figures[f.jsonKey()] = x
	}
	return nil
}
