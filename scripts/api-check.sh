#!/usr/bin/env bash
# api-check.sh: compare the API of the public module (events/: events,
# events/inbox) with the last release's, and fail on an incompatible
# change that CHANGELOG.md does not own up to (make api-check; .ci/run
# runs it on every change).
#
# The last release is the one scripts/release-notes.sh --last names, found
# by its commit in this clone's history (no tag needed). Its tree is
# exported with git archive; apidiff (golang.org/x/exp/cmd/apidiff,
# pinned in scripts/servers.sh) writes the export data of each public
# package of that tree and of this one, and lists the incompatible
# changes between them: a removed or changed exported identifier, a method
# added to an interface, a removed package.
#
# While the module's major version is 0, an incompatible change is allowed
# when the Unreleased section of CHANGELOG.md has a **Breaking** bullet that
# names it in backquotes, qualified by its package: `inbox.Config.Metrics`
# for a field, or `inbox.Config` for the whole type, `inbox.Inbox.Metrics`
# for a method; a removed or moved package by its old import path. From
# v1.0.0 on, an incompatible change needs a new major version (a /v2 module
# path), and this script fails on any.
#
# Releases made before the module existed (v0.1.0) had events and inbox in
# the relay's module, at github.com/outboxrelay/outbox/inbox for inbox: the
# script reads them from there.
#
# Usage: scripts/api-check.sh [RELEASE_COMMIT]; the commit defaults to the
# last release's. Exit 0: compatible, or every break acknowledged.
set -euo pipefail
cd "$(dirname "$0")/.."

# ensure_apidiff and APIDIFF (the pinned apidiff).
# shellcheck source=scripts/servers.sh
. scripts/servers.sh

module_dir=events
module=github.com/outboxrelay/outbox/events
# Where a package of the module lived in a release made before the module
# existed, when it was elsewhere.
declare -A before_module=(
	["$module/inbox"]=github.com/outboxrelay/outbox/inbox
)

if [ $# -ge 1 ]; then
	release=$1 commit=$1
else
	read -r release commit < <(bash scripts/release-notes.sh --last) ||
		die "no release to compare with (scripts/release-notes.sh --last)"
fi
git cat-file -e "$commit^{commit}" 2>/dev/null ||
	die "the release commit $commit is not in this clone's history (a shallow clone? git fetch --unshallow)"

ensure_apidiff

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/old"
git archive --format=tar "$commit" | tar -x -C "$work/old"

# The old tree's public packages: the module's, or, before it existed,
# events and inbox of the relay's module.
if [ -f "$work/old/$module_dir/go.mod" ]; then
	old_root=$work/old/$module_dir
	old_path() { echo "$1"; }
else
	old_root=$work/old
	old_path() { echo "${before_module[$1]:-$1}"; }
fi

# The release's major version: from v1 on, no break passes.
major=0
if [[ $release =~ ^v([0-9]+)\. ]]; then
	major=${BASH_REMATCH[1]}
fi

# The Unreleased section's **Breaking** bullets, one a line: a bullet is a
# line starting "- " and the indented lines after it.
breaking=$(awk '
	/^## / { in_section = ($2 == "Unreleased"); next }
	!in_section { next }
	/^- / { if (bullet ~ /\*\*Breaking\*\*/) print bullet; bullet = $0; next }
	/^[[:space:]]+[^[:space:]]/ && bullet != "" { bullet = bullet " " $0; next }
	{ if (bullet ~ /\*\*Breaking\*\*/) print bullet; bullet = "" }
	END { if (bullet ~ /\*\*Breaking\*\*/) print bullet }
' CHANGELOG.md | tr -s ' ')

# acknowledged NAME...: whether a Breaking bullet names one of NAMEs in
# backquotes.
acknowledged() {
	local name
	for name in "$@"; do
		if grep -qF "\`$name\`" <<<"$breaking"; then
			return 0
		fi
	done
	return 1
}

log "API of $module against $release ($commit)"
packages=$(cd "$module_dir" && go list ./... | grep -v '/internal/' || true)
[ -n "$packages" ] || die "go list found no public package in $module_dir/"

unowned=0
report() { # report MESSAGE: an incompatible change nobody owned up to
	echo "  INCOMPATIBLE: $1" >&2
	unowned=$((unowned + 1))
}

# The release's public packages: the module's, or, before it existed,
# those that became it.
declare -A now=()
for pkg in $packages; do
	now[$(old_path "$pkg")]=$pkg
done
if [ "$old_root" = "$work/old" ]; then
	old_packages=$(printf '%s\n' "${!now[@]}")
else
	old_packages=$(cd "$old_root" && go list ./... | grep -v '/internal/' || true)
fi
for pkg in $packages; do
	old=$(old_path "$pkg")
	name=${pkg##*/}
	if ! grep -qxF "$old" <<<"$old_packages"; then
		log "$pkg: new since $release"
		continue
	fi
	(cd "$old_root" && "$APIDIFF" -w "$work/old.$name.api" "$old") ||
		die "apidiff could not read $old in $release"
	(cd "$module_dir" && "$APIDIFF" -w "$work/new.$name.api" "$pkg") ||
		die "apidiff could not read $pkg"
	changes=$("$APIDIFF" -incompatible "$work/old.$name.api" "$work/new.$name.api")
	if [ "$old" != "$pkg" ]; then
		if [ "$major" -ge 1 ]; then
			report "$old moved to $pkg: importers must change"
		elif acknowledged "$old"; then
			log "$old moved to $pkg: acknowledged in CHANGELOG.md"
		else
			report "$old moved to $pkg: name \`$old\` in a **Breaking** bullet of CHANGELOG.md's Unreleased section"
		fi
	fi
	if [ -z "$changes" ]; then
		log "$pkg: compatible"
		continue
	fi
	# apidiff's lines: "- (*Inbox).Metrics: removed", "- Config.Registerer: removed".
	while IFS= read -r line; do
		[[ $line =~ ^-\ ([^:]+):\ (.*)$ ]] || continue
		ident=${BASH_REMATCH[1]} what=${BASH_REMATCH[2]}
		plain=$(sed -E 's/^\(\*?([^)]*)\)/\1/' <<<"$ident") # (*Inbox).Metrics -> Inbox.Metrics
		# The identifier, or a name it belongs to: Config.Registerer
		# is owned by `inbox.Config.Registerer` or by `inbox.Config`.
		names=() prefix=""
		IFS=. read -r -a parts <<<"$plain"
		for part in "${parts[@]}"; do
			prefix=${prefix:+$prefix.}$part
			names+=("$name.$prefix")
		done
		if [ "$major" -ge 1 ]; then
			report "$name.$plain: $what (needs a new major version: $module/v$((major + 1)))"
		elif acknowledged "${names[@]}"; then
			log "$name.$plain: $what: acknowledged in CHANGELOG.md"
		else
			report "$name.$plain: $what; name \`$name.$plain\` (or its type) in a **Breaking** bullet of CHANGELOG.md's Unreleased section"
		fi
	done <<<"$changes"
done

# A package of the release that this tree lost altogether.
for old in $old_packages; do
	if [ -z "${now[$old]:-}" ]; then
		if [ "$major" -lt 1 ] && acknowledged "$old"; then
			log "$old: removed: acknowledged in CHANGELOG.md"
		else
			report "$old: removed"
		fi
	fi
done

if [ "$unowned" -gt 0 ]; then
	die "$unowned incompatible change(s) of $module since $release that CHANGELOG.md does not name (scripts/api-check.sh says how)"
fi
log "API of $module: no unacknowledged incompatible change since $release"
