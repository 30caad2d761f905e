package scripts

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// gitRepo is a repository of its own in a temporary directory, with a
// copy of release-notes.sh, on which a test writes CHANGELOG.md, commits
// and tags as a maintainer would.
type gitRepo struct {
	t   *testing.T
	dir string
	day int // the committer day of the next commit, 2026-11-<day>
}

func newGitRepo(t *testing.T) *gitRepo {
	t.Helper()
	r := &gitRepo{t: t, dir: t.TempDir(), day: 1}
	script := readFile(t, "scripts/release-notes.sh")
	if err := os.MkdirAll(filepath.Join(r.dir, "scripts"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "scripts", "release-notes.sh"), script, 0o755); err != nil {
		t.Fatal(err)
	}
	r.git("init", "-q", "-b", "main")
	return r
}

// git runs git in the repository, with a fixed identity and the day of
// the next commit, and fails the test if it fails.
func (r *gitRepo) git(args ...string) string {
	r.t.Helper()
	out, err := r.run(exec.CommandContext(r.t.Context(), "git", args...))
	if err != nil {
		r.t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(out)
}

func (r *gitRepo) run(cmd *exec.Cmd) (string, error) {
	date := "2026-11-" + fmt.Sprintf("%02d", r.day) + "T12:00:00Z"
	cmd.Dir = r.dir
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com",
		"GIT_AUTHOR_DATE="+date, "GIT_COMMITTER_DATE="+date, "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_NOSYSTEM=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// commit writes CHANGELOG.md and commits it on the next day; it returns
// the commit's hash and day.
func (r *gitRepo) commit(changelog string) (hash, day string) {
	r.t.Helper()
	if err := os.WriteFile(filepath.Join(r.dir, "CHANGELOG.md"), []byte(changelog), 0o644); err != nil {
		r.t.Fatal(err)
	}
	r.git("add", "-A")
	r.git("commit", "-q", "-m", "change")
	day = "2026-11-" + fmt.Sprintf("%02d", r.day)
	r.day++
	return r.git("rev-parse", "HEAD"), day
}

// check runs release-notes.sh --check and returns its output and whether
// it passed.
func (r *gitRepo) check() (string, bool) {
	r.t.Helper()
	out, err := r.run(exec.CommandContext(r.t.Context(), "bash", "scripts/release-notes.sh", "--check"))
	if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
		r.t.Fatal(err)
	}
	return out, err == nil
}

func (r *gitRepo) notes(tag string) (string, bool) {
	r.t.Helper()
	out, err := r.run(exec.CommandContext(r.t.Context(), "bash", "scripts/release-notes.sh", tag))
	if exitErr := (*exec.ExitError)(nil); err != nil && !errors.As(err, &exitErr) {
		r.t.Fatal(err)
	}
	return out, err == nil
}

// wantLast checks what release-notes.sh --last prints: "" wants it to
// fail.
func (r *gitRepo) wantLast(want string) {
	r.t.Helper()
	out, err := r.run(exec.CommandContext(r.t.Context(), "bash", "scripts/release-notes.sh", "--last"))
	if want == "" {
		if err == nil {
			r.t.Fatalf("release-notes.sh --last = %q, want it to fail: no release is recorded", out)
		}
		return
	}
	if err != nil || strings.TrimSpace(out) != want {
		r.t.Fatalf("release-notes.sh --last = %q (%v), want %q", out, err, want)
	}
}

func (r *gitRepo) wantCheck(pass bool, wantOutput string) {
	r.t.Helper()
	out, ok := r.check()
	if ok != pass || !strings.Contains(out, wantOutput) {
		r.t.Fatalf("release-notes.sh --check passed=%v, want %v with %q in its output:\n%s", ok, pass, wantOutput, out)
	}
}

func record(hash, day string) string {
	return "Released from commit " + hash + " on " + day + ".\n\n"
}

// A release as CONTRIBUTING.md says to make one: the commit that names
// the version, its tag, then the commit that records it. Each step passes
// the check, and each way of getting it wrong fails it, naming what is
// wrong.
func TestReleaseRecords(t *testing.T) {
	t.Parallel()
	r := newGitRepo(t)
	const v1 = "# Changelog\n\n## Unreleased\n\n## v0.1.0\n\n- The first release.\n\n## Earlier\n\n- History.\n"
	r.commit("# Changelog\n\n## Unreleased\n\n- The first release.\n\n## Earlier\n\n- History.\n")
	r.wantCheck(true, "release sections: 0")

	// The release commit names the version; untagged, it has no record.
	rel1, day1 := r.commit(v1)
	r.wantCheck(false, `"## v0.1.0" has no release record`)
	// Tagged, it is the release being made: its tag is on HEAD.
	r.git("tag", "-a", "v0.1.0", "-m", "v0.1.0")
	r.wantCheck(true, "release sections: 1")
	r.wantLast("") // not recorded yet
	if out, ok := r.notes("v0.1.0"); !ok || out != "- The first release.\n\n" {
		t.Errorf("notes of v0.1.0 = %q (passed %v), want the section's text", out, ok)
	}
	// The commit after the tag must record it.
	r.commit(v1 + "\n")
	r.wantCheck(false, `add the line "Released from commit `+rel1+` on <YYYY-MM-DD>."`)
	withRecord := strings.Replace(v1, "## v0.1.0\n\n", "## v0.1.0\n\n"+record(rel1, day1), 1)
	r.commit(withRecord)
	r.wantCheck(true, "release sections: 1")
	r.wantLast("v0.1.0 " + rel1)
	// The notes leave the record out: the same as at the tag.
	if out, ok := r.notes("v0.1.0"); !ok || out != "- The first release.\n\n" {
		t.Errorf("notes of v0.1.0 = %q (passed %v), want the section's text without its record", out, ok)
	}

	// A copy without the tags still finds the release by its record.
	r.git("tag", "-d", "v0.1.0")
	r.wantCheck(true, "v* tags here: 0")
	r.git("tag", "-a", "v0.1.0", "-m", "v0.1.0", rel1)

	// A record that names another commit than the tag's.
	head := r.git("rev-parse", "HEAD")
	r.commit(strings.Replace(v1, "## v0.1.0\n\n", "## v0.1.0\n\n"+record(head, day1), 1))
	r.wantCheck(false, "but the tag v0.1.0 points at "+rel1)
	if _, ok := r.notes("v0.1.0"); ok {
		t.Error("release-notes.sh v0.1.0 passed with a record that is not the tag's commit")
	}
	// A wrong day.
	r.commit(strings.Replace(v1, "## v0.1.0\n\n", "## v0.1.0\n\n"+record(rel1, "2026-10-01"), 1))
	r.wantCheck(false, "on 2026-10-01, but that commit is of "+day1)
	// A commit this repository does not have.
	r.commit(strings.Replace(v1, "## v0.1.0\n\n", "## v0.1.0\n\n"+record(strings.Repeat("ab", 20), day1), 1))
	r.wantCheck(false, "which this repository does not have")
	// A commit whose CHANGELOG.md did not have the section yet.
	first := r.git("rev-list", "--max-parents=0", "HEAD")
	firstDay := r.git("show", "-s", "--format=%cs", first)
	r.git("tag", "-d", "v0.1.0")
	r.commit(strings.Replace(v1, "## v0.1.0\n\n", "## v0.1.0\n\n"+record(first, firstDay), 1))
	r.wantCheck(false, `whose CHANGELOG.md has no section "## v0.1.0"`)
	r.git("tag", "-a", "v0.1.0", "-m", "v0.1.0", rel1)
	r.commit(withRecord)
	r.wantCheck(true, "v* tags here: 1")

	// A tag without its section.
	r.git("tag", "-a", "v0.1.1", "-m", "v0.1.1")
	r.wantCheck(false, `the tag v0.1.1 has no section "## v0.1.1"`)
	r.git("tag", "-d", "v0.1.1")

	// An empty section.
	r.commit(strings.Replace(withRecord, "## Unreleased\n", "## Unreleased\n\n## v0.2.0\n", 1))
	r.git("tag", "-a", "v0.2.0", "-m", "v0.2.0")
	r.wantCheck(false, `"## v0.2.0" is empty`)
	r.git("tag", "-d", "v0.2.0")

	// The second release, recorded: newer sections name later commits.
	v2 := strings.Replace(withRecord, "## Unreleased\n", "## Unreleased\n\n## v0.2.0\n\n- The second.\n", 1)
	rel2, day2 := r.commit(v2)
	r.git("tag", "-a", "v0.2.0", "-m", "v0.2.0")
	r.wantCheck(true, "release sections: 2")
	r.wantLast("v0.1.0 " + rel1) // the newest recorded
	r.commit(strings.Replace(v2, "## v0.2.0\n\n", "## v0.2.0\n\n"+record(rel2, day2), 1))
	r.wantCheck(true, "release sections: 2, each with its commit; v* tags here: 2")
	r.wantLast("v0.2.0 " + rel2)
	// Two sections that name one commit, or the older the later commit.
	r.git("tag", "-d", "v0.1.0", "v0.2.0")
	swapped := strings.Replace(strings.Replace(v2, "## v0.2.0\n\n", "## v0.2.0\n\n"+record(rel1, day1), 1),
		record(rel1, day1)+"- The first", record(rel2, day2)+"- The first", 1)
	r.commit(swapped)
	r.wantCheck(false, `"## v0.1.0" (commit `+rel2+`) is not in the history of the newer release "## v0.2.0"`)
	same := strings.Replace(v2, "## v0.2.0\n\n", "## v0.2.0\n\n"+record(rel1, day1), 1)
	r.commit(same)
	r.wantCheck(false, `name the same commit `+rel1)
}

// A commit that is not in HEAD's history (a release made from a branch
// that was never merged) is refused.
func TestReleaseRecordOffHistory(t *testing.T) {
	t.Parallel()
	r := newGitRepo(t)
	r.commit("# Changelog\n\n## Unreleased\n")
	r.git("checkout", "-q", "-b", "side")
	const v1 = "# Changelog\n\n## Unreleased\n\n## v0.1.0\n\n- The first release.\n"
	side, day := r.commit(v1)
	r.git("checkout", "-q", "main")
	r.commit(strings.Replace(v1, "## v0.1.0\n\n", "## v0.1.0\n\n"+record(side, day), 1))
	r.wantCheck(false, "which is not in the history of HEAD")
}

// The check needs the history: a shallow clone fails, saying so, rather
// than passing without having looked.
func TestReleaseCheckRefusesAShallowClone(t *testing.T) {
	t.Parallel()
	r := newGitRepo(t)
	r.commit("# Changelog\n\n## Unreleased\n\n- a\n")
	r.commit("# Changelog\n\n## Unreleased\n\n- b\n")
	clone := &gitRepo{t: t, dir: filepath.Join(t.TempDir(), "clone"), day: r.day}
	r.git("clone", "-q", "--depth", "1", "file://"+r.dir, clone.dir)
	clone.wantCheck(false, "this clone is shallow")
}

// This repository: every release section has its commit and every v*
// tag here its section (the test needs a clone with history, as the
// mixed-version test does).
func TestRepositoryReleases(t *testing.T) {
	t.Parallel()
	cmd := exec.CommandContext(t.Context(), "bash", "scripts/release-notes.sh", "--check")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/release-notes.sh --check: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "release sections: ") || strings.Contains(string(out), "release sections: 0,") {
		t.Errorf("scripts/release-notes.sh --check found no release in CHANGELOG.md:\n%s", out)
	}
}
