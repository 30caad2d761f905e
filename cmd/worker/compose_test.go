package main

import (
	"cmp"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// Docker is not needed for these tests: they keep docker-compose.yml,
// docs/configuration.md and the README's settings table in step with the
// settings table in config.go.

const (
	composePath = "../../docker-compose.yml"
	configDoc   = "../../docs/configuration.md"
)

// composeFile is the part of a compose file these tests read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image       string                  `yaml:"image"`
	Build       any                     `yaml:"build"`
	Command     stringOrList            `yaml:"command"`
	Environment composeEnv              `yaml:"environment"`
	Deploy      struct{ Replicas *int } `yaml:"deploy"`
	Ports       []composePort           `yaml:"ports"`
	Healthcheck struct {
		Test stringOrList `yaml:"test"`
	} `yaml:"healthcheck"`
}

// stringOrList is a compose command or healthcheck test: a string or a list.
type stringOrList []string

func (s *stringOrList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = stringOrList{n.Value}
		return nil
	}
	var l []string
	if err := n.Decode(&l); err != nil {
		return err
	}
	*s = l
	return nil
}

// composePort is one published port: the short syntax
// "[HOST_IP:]HOST_PORT:CONTAINER_PORT", or the long one, a map whose
// host_ip is the address it is published on. hostIP is "" when the port
// is published on every interface.
type composePort struct {
	spec   string // as written, for messages
	hostIP string
}

func (p *composePort) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		p.spec = n.Value
		p.hostIP = shortPortHostIP(n.Value)
	case yaml.MappingNode:
		var long struct {
			HostIP    string `yaml:"host_ip"`
			Published any    `yaml:"published"`
			Target    any    `yaml:"target"`
		}
		if err := n.Decode(&long); err != nil {
			return err
		}
		p.spec = fmt.Sprintf("host_ip %q, published %v, target %v", long.HostIP, long.Published, long.Target)
		p.hostIP = long.HostIP
	default:
		return fmt.Errorf("line %d: a port must be a string or a map", n.Line)
	}
	return nil
}

// shortPortHostIP is the host address of a short port spec: what comes
// before the last two colon-separated parts (an IPv6 address in brackets
// holds colons of its own), or "" for "8080" and "8081:8080".
func shortPortHostIP(spec string) string {
	spec, _, _ = strings.Cut(spec, "/") // a protocol: "5672:5672/tcp"
	if strings.HasPrefix(spec, "[") {
		if end := strings.Index(spec, "]"); end > 0 {
			return spec[1:end]
		}
	}
	parts := strings.Split(spec, ":")
	if len(parts) < 3 {
		return ""
	}
	return strings.Join(parts[:len(parts)-2], ":")
}

// composeEnv is a compose environment: a map, or a list of KEY=VALUE.
type composeEnv map[string]string

func (e *composeEnv) UnmarshalYAML(n *yaml.Node) error {
	env := composeEnv{}
	switch n.Kind {
	case yaml.MappingNode:
		var m map[string]*string // a key with no value passes the host's value through
		if err := n.Decode(&m); err != nil {
			return err
		}
		for k, v := range m {
			if v == nil {
				return fmt.Errorf("line %d: %s has no value: the stack must not depend on the host's environment", n.Line, k)
			}
			env[k] = *v
		}
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		for _, kv := range l {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return fmt.Errorf("line %d: %q has no value: the stack must not depend on the host's environment", n.Line, kv)
			}
			env[k] = v
		}
	default:
		return fmt.Errorf("line %d: environment must be a map or a list", n.Line)
	}
	*e = env
	return nil
}

func loadCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile(composePath)
	if err != nil {
		t.Fatalf("read compose file: %v", err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("parse %s: %v", composePath, err)
	}
	if len(c.Services) == 0 {
		t.Fatalf("%s defines no services", composePath)
	}
	return c
}

// workerServices returns the services that run the worker: "worker", or
// "worker-1", "worker2" and so on.
func workerServices(c composeFile) []string {
	var names []string
	for name := range c.Services {
		if name == "worker" || regexp.MustCompile(`^worker-?\d+$`).MatchString(name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func TestComposeServices(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)

	for _, name := range []string{"mongo", "rabbitmq", "producer", "consumer"} {
		if _, ok := c.Services[name]; !ok {
			t.Errorf("service %q is missing", name)
		}
	}

	mongo := c.Services["mongo"]
	if !strings.HasPrefix(mongo.Image, "mongo:") {
		t.Errorf("mongo image = %q, want a mongo: image", mongo.Image)
	}
	if !slices.ContainsFunc(mongo.Command, func(a string) bool { return strings.Contains(a, "--replSet") }) {
		t.Errorf("mongo command %q lacks --replSet: transactions need a replica set", mongo.Command)
	}
	if test := strings.Join(mongo.Healthcheck.Test, " "); !strings.Contains(test, "rs.initiate") {
		t.Errorf("mongo healthcheck %q does not run rs.initiate: the replica set would never get a primary", test)
	}
	if img := c.Services["rabbitmq"].Image; !strings.HasPrefix(img, "rabbitmq:3") {
		t.Errorf("rabbitmq image = %q, want rabbitmq:3-management", img)
	}

	workers := workerServices(c)
	replicas := 0
	for _, name := range workers {
		n := 1
		if r := c.Services[name].Deploy.Replicas; r != nil {
			n = *r
		}
		replicas += n
	}
	if replicas != 3 {
		t.Errorf("worker services %q run %d replicas in all, want 3", workers, replicas)
	}
}

// TestComposePortsOnLoopback checks that every service publishes its
// ports on 127.0.0.1 (or ::1) only: MongoDB without authentication and
// RabbitMQ's guest account must not be reachable from other machines.
func TestComposePortsOnLoopback(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)
	published := 0
	for name, svc := range c.Services {
		for _, p := range svc.Ports {
			published++
			if p.hostIP != "127.0.0.1" && p.hostIP != "::1" {
				t.Errorf("service %s publishes %q on %q, want 127.0.0.1:HOST_PORT:CONTAINER_PORT", name, p.spec, cmp.Or(p.hostIP, "every interface"))
			}
		}
	}
	if published == 0 {
		t.Error("no service publishes a port: is the parse of ports broken?")
	}
}

func TestShortPortHostIP(t *testing.T) {
	t.Parallel()
	for spec, want := range map[string]string{
		"8080":                     "",
		"27017:27017":              "",
		"8081-8083:8080":           "",
		"5672:5672/tcp":            "",
		"127.0.0.1:27017:27017":    "127.0.0.1",
		"127.0.0.1:8081-8083:8080": "127.0.0.1",
		"0.0.0.0:5672:5672":        "0.0.0.0",
		"[::1]:5672:5672":          "::1",
		"[::]:5672:5672/udp":       "::",
	} {
		if got := shortPortHostIP(spec); got != want {
			t.Errorf("shortPortHostIP(%q) = %q, want %q", spec, got, want)
		}
	}
}

// TestComposeWorkerEnvironment checks that every OUTBOX_* variable set on a
// worker service is a setting of config.go, and that the worker accepts the
// values: it loads them exactly as `worker run` would at start.
func TestComposeWorkerEnvironment(t *testing.T) {
	t.Parallel()
	c := loadCompose(t)

	known := map[string]bool{}
	for _, s := range settings() {
		known[s.env] = true
	}
	workers := workerServices(c)
	if len(workers) == 0 {
		t.Fatal("no worker service")
	}
	for _, name := range workers {
		env := c.Services[name].Environment
		for k := range env {
			if strings.HasPrefix(k, "OUTBOX_") && !known[k] {
				t.Errorf("service %s sets %s, which is not a worker setting (cmd/worker/config.go settings())", name, k)
			}
		}
		if _, _, err := loadConfig("run", nil, func(k string) string { return env[k] }, relayCommand, nil); err != nil {
			t.Errorf("service %s: the worker would refuse its environment: %v", name, err)
		}
		// The URIs must name services of this file, not localhost.
		for _, v := range []struct{ env, service string }{
			{"OUTBOX_MONGO_URI", "mongo"},
			{"OUTBOX_AMQP_URL", "rabbitmq"},
		} {
			u, err := url.Parse(env[v.env])
			if err != nil || u.Hostname() != v.service {
				t.Errorf("service %s: %s = %q, want a URL whose host is the %q service", name, v.env, env[v.env], v.service)
			}
		}
	}

	// The demo producer and consumer read the same names; they must mean
	// the same thing as for the worker.
	for _, name := range []string{"producer", "consumer"} {
		for k := range c.Services[name].Environment {
			if strings.HasPrefix(k, "OUTBOX_") && !known[k] {
				t.Errorf("service %s sets %s, which is not a worker setting", name, k)
			}
		}
	}
}

const readme = "../../README.md"

// TestComposeConfigurationDoc checks that docs/configuration.md has a
// table row for every setting, naming its variable, its flag and its
// default, and none for a variable the worker does not read.
func TestComposeConfigurationDoc(t *testing.T) {
	t.Parallel()
	checkSettingsTable(t, configDoc, true)
}

// TestReadmeSettings checks the same of the README's settings table,
// which gives each setting's variable and default (its flag is the
// variable's name, as the README says).
func TestReadmeSettings(t *testing.T) {
	t.Parallel()
	checkSettingsTable(t, readme, false)
}

// checkSettingsTable checks that the document at path has a table row
// starting with | `OUTBOX_...` for every setting, with the setting's
// default and, if withFlag, its flag; and no such row for a variable the
// worker does not read.
func checkSettingsTable(t *testing.T, path string, withFlag bool) {
	t.Helper()
	name := strings.TrimPrefix(path, "../../")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	rows := map[string]string{} // env var -> its table row
	for _, line := range strings.Split(string(b), "\n") {
		if m := regexp.MustCompile("^\\| `(OUTBOX_[A-Z_]+)`").FindStringSubmatch(line); m != nil {
			rows[m[1]] = line
		}
	}
	for _, s := range settings() {
		row, ok := rows[s.env]
		if !ok {
			t.Errorf("%s has no table row starting with | `%s`", name, s.env)
			continue
		}
		if withFlag && !strings.Contains(row, "`--"+s.flag+"`") {
			t.Errorf("%s row of %s does not name its flag `--%s`", name, s.env, s.flag)
		}
		def := "`" + s.def + "`"
		switch {
		case s.env == "OUTBOX_WORKER_ID":
			def = "<hostname>-<pid>" // the real default differs per process
		case s.def == "":
			def = "unset"
		}
		if !strings.Contains(row, def) {
			t.Errorf("%s row of %s does not give its default %s", name, s.env, def)
		}
	}
	var extra []string
	for env := range rows {
		if !slices.ContainsFunc(settings(), func(s setting) bool { return s.env == env }) {
			extra = append(extra, env)
		}
	}
	if len(extra) > 0 {
		slices.Sort(extra)
		t.Errorf("%s documents variables the worker does not read: %q", name, extra)
	}
}
