// Package scripts holds no code. Its tests keep the release tooling
// honest: scripts/release-notes.sh checks the release records of
// CHANGELOG.md against the tags in both directions, and the release
// configuration (.goreleaser.yaml, the Dockerfiles, the workflows) carries
// the license and names the build the way the worker names itself.
package scripts
