#!/usr/bin/env bash
# release-notes.sh TAG: print the section of CHANGELOG.md for TAG (the
# lines after its "## TAG" heading, up to the next "## " heading), the
# notes of its GitHub release. A tag without a section, or with an empty
# one, fails: every release says what changed.
set -euo pipefail
tag=${1:?usage: scripts/release-notes.sh vX.Y.Z}
cd "$(dirname "$0")/.."
notes=$(awk -v tag="$tag" '
	/^## / { if (found) exit; split($0, h, " "); if (h[2] == tag) { found = 1; next } }
	found { print }
' CHANGELOG.md)
if [ -z "$(printf '%s' "$notes" | tr -d '[:space:]')" ]; then
	echo "CHANGELOG.md has no section \"## $tag\" with content: add it before tagging" >&2
	exit 1
fi
printf '%s\n' "$notes"
