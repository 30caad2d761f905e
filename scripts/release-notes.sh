#!/usr/bin/env bash
# release-notes.sh TAG: print the section of CHANGELOG.md for TAG (the
# lines after its "## TAG" heading, up to the next "## " heading, without
# its release record), the notes of its GitHub release. A tag without a
# section, or with an empty one, fails: every release says what changed.
#
# release-notes.sh --last: print the newest release that CHANGELOG.md
# records, "vX.Y.Z <full commit hash>" (the mixed-version test builds it);
# fails when no release section has a record.
#
# release-notes.sh --check: check the releases both ways, from CHANGELOG.md
# and from the tags (make release-check, CI on every push):
#   - every release section "## vX.Y.Z" has content and a release record,
#     the line "Released from commit <full hash> on <YYYY-MM-DD>.", naming
#     a commit of HEAD's history (on that day, by its committer date) whose
#     own CHANGELOG.md has the section, and where the tag vX.Y.Z points if
#     the tag exists here; newer sections name later commits;
#   - every v* tag has its section.
# A commit cannot name itself: the section of the release being tagged
# needs no record while its tag points at HEAD, and the commit after the
# tag adds it (CONTRIBUTING.md, "How a change is released"). The records
# are what makes a release findable in a copy of the repository without
# its tags. The check reads the history, so it needs a clone that is not
# shallow.
set -euo pipefail
usage="usage: scripts/release-notes.sh vX.Y.Z | --check | --last"
arg=${1:?$usage}
cd "$(dirname "$0")/.."

record_re='^Released from commit ([0-9a-f]{40}) on ([0-9]{4}-[0-9]{2}-[0-9]{2})\.$'

# section FILE TAG: the lines of TAG's section of FILE, record included.
section() {
	awk -v tag="$2" '
		/^## / { if (found) exit; split($0, h, " "); if (h[2] == tag) { found = 1; next } }
		found { print }
	' "$1"
}

# has_section FILE TAG: whether FILE has the heading "## TAG".
has_section() {
	awk -v tag="$2" '/^## / { split($0, h, " "); if (h[2] == tag) found = 1 } END { exit !found }' "$1"
}

# notes TAG: the section without its release record.
notes() {
	section CHANGELOG.md "$1" | grep -Ev "$record_re" | awk 'NF { text = 1 } text' || true
}

# tag_commit TAG: the commit TAG points at, or nothing when there is no
# such tag here.
tag_commit() {
	git rev-parse -q --verify "refs/tags/$1^{commit}" 2>/dev/null || true
}

if [ "$arg" = "--last" ]; then
	while read -r tag; do
		record=$(section CHANGELOG.md "$tag" | grep -E "$record_re" | head -n 1 || true)
		if [[ $record =~ $record_re ]]; then
			echo "$tag ${BASH_REMATCH[1]}"
			exit 0
		fi
	done < <(awk '/^## v[0-9]/ { print $2 }' CHANGELOG.md)
	echo "CHANGELOG.md records no release (no \"Released from commit ...\" under a \"## vX.Y.Z\" heading)" >&2
	exit 1
fi

if [ "$arg" != "--check" ]; then
	tag=$arg
	if [ -z "$(notes "$tag" | tr -d '[:space:]')" ]; then
		echo "CHANGELOG.md has no section \"## $tag\" with content: add it before tagging" >&2
		exit 1
	fi
	record=$(section CHANGELOG.md "$tag" | grep -E "$record_re" | head -n 1 || true)
	at=$(tag_commit "$tag")
	if [ -n "$record" ] && [ -n "$at" ] && [[ $record =~ $record_re ]] && [ "${BASH_REMATCH[1]}" != "$at" ]; then
		echo "CHANGELOG.md: \"## $tag\" was released from commit ${BASH_REMATCH[1]}, but the tag $tag points at $at" >&2
		exit 1
	fi
	notes "$tag"
	exit 0
fi

[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
if [ "$(git rev-parse --is-shallow-repository)" = "true" ]; then
	echo "release-notes.sh --check reads the history: this clone is shallow (git fetch --unshallow --tags)" >&2
	exit 1
fi
head=$(git rev-parse HEAD)
errors=0
fail() {
	echo "CHANGELOG.md: $*" >&2
	errors=$((errors + 1))
}

newer_commit="" newer_tag=""
declare -A seen=()
while read -r tag; do
	if [ -z "$(notes "$tag" | tr -d '[:space:]')" ]; then
		fail "\"## $tag\" is empty: a release says what changed"
	fi
	at=$(tag_commit "$tag")
	records=$(section CHANGELOG.md "$tag" | grep -E "$record_re" || true)
	if [ -z "$records" ]; then
		if [ -n "$at" ] && [ "$at" = "$head" ]; then
			# The release being tagged: the next commit records it.
			newer_commit=$head newer_tag=$tag
			continue
		fi
		fail "\"## $tag\" has no release record: add the line \"Released from commit ${at:-<full commit hash>} on <YYYY-MM-DD>.\" under it"
		continue
	fi
	if [ "$(printf '%s\n' "$records" | wc -l)" -gt 1 ]; then
		fail "\"## $tag\" has more than one release record"
		continue
	fi
	[[ $records =~ $record_re ]]
	commit=${BASH_REMATCH[1]} day=${BASH_REMATCH[2]}
	if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
		fail "\"## $tag\" was released from commit $commit, which this repository does not have"
		continue
	fi
	if ! git merge-base --is-ancestor "$commit" HEAD; then
		fail "\"## $tag\" was released from commit $commit, which is not in the history of HEAD"
	fi
	if [ -n "${seen[$commit]:-}" ]; then
		fail "\"## $tag\" and \"## ${seen[$commit]}\" name the same commit $commit"
	fi
	seen[$commit]=$tag
	if [ "$(git show -s --format=%cs "$commit")" != "$day" ]; then
		fail "\"## $tag\" was released from commit $commit on $day, but that commit is of $(git show -s --format=%cs "$commit")"
	fi
	if ! has_section <(git show "$commit:CHANGELOG.md" 2>/dev/null) "$tag"; then
		fail "\"## $tag\" was released from commit $commit, whose CHANGELOG.md has no section \"## $tag\""
	fi
	if [ -n "$at" ] && [ "$at" != "$commit" ]; then
		fail "\"## $tag\" was released from commit $commit, but the tag $tag points at $at"
	fi
	if [ -n "$newer_commit" ] && ! git merge-base --is-ancestor "$commit" "$newer_commit"; then
		fail "\"## $tag\" (commit $commit) is not in the history of the newer release \"## $newer_tag\" (commit $newer_commit)"
	fi
	newer_commit=$commit newer_tag=$tag
done < <(awk '/^## v[0-9]/ { print $2 }' CHANGELOG.md)

while read -r tag; do
	[ -n "$tag" ] || continue
	if ! has_section CHANGELOG.md "$tag"; then
		fail "the tag $tag has no section \"## $tag\": every release has its notes and record"
	fi
done < <(git tag -l 'v*')

if [ "$errors" -gt 0 ]; then
	exit 1
fi
echo "CHANGELOG.md: release sections: $(awk '/^## v[0-9]/' CHANGELOG.md | wc -l | tr -d ' '), each with its commit; v* tags here: $(git tag -l 'v*' | wc -l | tr -d ' '), each with its section"
