#!/usr/bin/env bash
# release-snapshot.sh [DIST]: check what a GoReleaser run left in DIST
# (dist/ by default), as `make release-snapshot` runs it after a snapshot
# release and CI after that: what a release publishes, short of the image
# and the signatures, which need docker buildx and the workflow's identity.
#   - every archive holds LICENSE and the worker, and has its SBOM,
#     <archive>.sbom.json, an SPDX document that lists the worker's Go
#     modules (the MongoDB driver and the RabbitMQ client at the versions
#     of go.mod);
#   - checksums.txt covers every archive and SBOM, and they match;
#   - the binary of this machine's platform names the build the release
#     metadata says (worker version --json: version = the tag, revision
#     = the commit, buildDate = the release's date, goos/goarch = its
#     platform), which the image's labels and annotations also take
#     (.goreleaser.yaml; scripts/'s tests hold them to the same templates).
# Needs jq, sha256sum and tar.
set -euo pipefail
dist=${1:-dist}
cd "$(dirname "$0")/.."
errors=0
fail() {
	echo "release-snapshot: $*" >&2
	errors=$((errors + 1))
}
for tool in jq sha256sum tar; do
	command -v "$tool" >/dev/null || { echo "release-snapshot: $tool is not on PATH" >&2; exit 1; }
done
[ -f "$dist/metadata.json" ] && [ -f "$dist/artifacts.json" ] ||
	{ echo "release-snapshot: $dist has no metadata.json and artifacts.json: run goreleaser release --snapshot first" >&2; exit 1; }

# The modules the SBOMs must list, at the versions go.mod asks for.
modules=(go.mongodb.org/mongo-driver/v2 github.com/rabbitmq/amqp091-go)

archives=$(jq -r '.[] | select(.type == "Archive") | .path' "$dist/artifacts.json")
[ -n "$archives" ] || fail "no archive in $dist/artifacts.json"
for path in $archives; do
	name=$(basename "$path")
	listing=$(tar -tzf "$path")
	for want in LICENSE worker; do
		grep -qx "$want" <<<"$listing" || fail "$name does not hold $want"
	done
	sbom="$path.sbom.json"
	if [ ! -f "$sbom" ]; then
		fail "$name has no SBOM ($(basename "$sbom"))"
		continue
	fi
	jq -e '.spdxVersion | startswith("SPDX-")' "$sbom" >/dev/null || fail "$(basename "$sbom") is not an SPDX document"
	for m in "${modules[@]}"; do
		v=$(awk -v m="$m" '$1 == m { print $2; exit }' go.mod)
		[ -n "$v" ] || { fail "go.mod does not require $m"; continue; }
		jq -e --arg m "$m" --arg v "$v" 'any(.packages[]; .name == $m and .versionInfo == $v)' "$sbom" >/dev/null ||
			fail "$(basename "$sbom") does not list $m $v"
	done
	for f in "$name" "$name.sbom.json"; do
		grep -q "  $f\$" "$dist/checksums.txt" || fail "checksums.txt does not cover $f"
	done
done
(cd "$dist" && sha256sum --quiet -c checksums.txt) || fail "checksums.txt does not match the files"

tag=$(jq -r .tag "$dist/metadata.json")
commit=$(jq -r .commit "$dist/metadata.json")
date=$(date -u -d "$(jq -r .date "$dist/metadata.json")" +%Y-%m-%dT%H:%M:%SZ)
goos=$(go env GOOS) goarch=$(go env GOARCH)
bin=$(jq -r --arg os "$goos" --arg arch "$goarch" \
	'first(.[] | select(.type == "Binary" and .goos == $os and .goarch == $arch) | .path) // empty' "$dist/artifacts.json")
if [ -z "$bin" ]; then
	fail "no binary for $goos/$goarch to run"
else
	got=$("$bin" version --json)
	want=$(jq -cn --arg v "$tag" --arg r "$commit" --arg d "$date" --arg os "$goos" --arg arch "$goarch" \
		'{version: $v, revision: $r, buildDate: $d, goos: $os, goarch: $arch}')
	jq -e --argjson want "$want" '. as $got | $want | to_entries | all(.value == $got[.key])' <<<"$got" >/dev/null ||
		fail "$bin version --json = $got, want $want (the release's tag, commit and date)"
fi

if [ "$errors" -gt 0 ]; then
	exit 1
fi
echo "release-snapshot: $(wc -w <<<"$archives" | tr -d ' ') archives with LICENSE and their SBOMs, checksums match; $bin names $tag, $commit, $date"
