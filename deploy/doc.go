// Package deploy holds no code. Its tests keep the deployment files beside
// it honest: the Prometheus rules pass their promtool unit tests, the
// PrometheusRule of the Kubernetes base is the rule file, and every metric
// the rules and the Grafana dashboard query is one the worker exports.
// The MongoDB roles of mongodb/roles.js name their collections one by one
// and allow no more than each command needs. cmd/worker's
// kubernetes_test.go checks the Kubernetes base against the worker's
// settings, its setup Job included.
package deploy
