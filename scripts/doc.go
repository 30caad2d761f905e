// Package scripts holds no code. Its tests keep the release tooling
// honest: scripts/release-notes.sh checks the release records of
// CHANGELOG.md against the tags in both directions, and the release
// configuration (.goreleaser.yaml, the Dockerfiles, the workflows) carries
// the license and names the build the way the worker names itself;
// scripts/api-check.sh fails on an unnamed break of the public module's
// API. They also run the public module's own tests (events/, a nested
// module that `go test ./...` does not enter) with this suite's servers.
package scripts
