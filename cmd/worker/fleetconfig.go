package main

// The outboxes the relay relays: those of the fleet file
// (OUTBOX_FLEET_FILE), or, without one, the one outbox the environment
// describes, as before there were fleets.

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/outboxrelay/outbox/claim"
	"github.com/outboxrelay/outbox/fleet"
	"github.com/outboxrelay/outbox/mongo"
)

// implicitOutbox names the one outbox of a worker without a fleet file,
// in its logs, its metrics' outbox label and /status.
const implicitOutbox = "default"

// outboxConfig is one outbox and every setting it relays with: the
// worker's own, with what the fleet file sets for it in their place.
type outboxConfig struct {
	Name string
	// Databases, when set, makes this an entry of the fleet file that
	// names a pattern of databases rather than one (fleet.Outbox's
	// Databases): a template of the outboxes discovery finds
	// (discover.go), never relayed itself. Its Config is then as parsed,
	// its MongoDatabase unset: each discovered outbox derives what it
	// derives (its CloudEvents source) from its own database.
	Databases string
	Config
}

// template reports whether oc is a pattern of outboxes rather than one.
func (oc outboxConfig) template() bool { return oc.Databases != "" }

// fleetFieldSettings maps each field of the fleet file to the variable of
// the setting it sets for its outbox: the value is parsed by that
// setting's parser, so that it means in the file what it means in the
// environment.
var fleetFieldSettings = map[string]string{
	"mongo_uri":             "OUTBOX_MONGO_URI",
	"database":              "OUTBOX_MONGO_DATABASE",
	"collection":            "OUTBOX_MONGO_COLLECTION",
	"exchange":              "OUTBOX_AMQP_EXCHANGE",
	"batch_size":            "OUTBOX_BATCH_SIZE",
	"claim_schedule":        "OUTBOX_CLAIM_SCHEDULE",
	"claim_idle_max":        "OUTBOX_CLAIM_IDLE_MAX",
	"recovery_schedule":     "OUTBOX_RECOVERY_SCHEDULE",
	"wake_on_insert":        "OUTBOX_WAKE_ON_INSERT",
	"max_attempts":          "OUTBOX_MAX_ATTEMPTS",
	"ordering":              "OUTBOX_ORDERING",
	"ordering_after_failed": "OUTBOX_ORDERING_AFTER_FAILED",
	"message_format":        "OUTBOX_MESSAGE_FORMAT",
	"cloudevents_source":    "OUTBOX_CLOUDEVENTS_SOURCE",
	"cloudevents_prefix":    "OUTBOX_CLOUDEVENTS_PREFIX",
	"retention":             "OUTBOX_RETENTION",
}

// loadOutboxes returns the outboxes of the fleet file named by
// raw.FleetFile, each one's settings validated, or the one implicit
// outbox of raw. raw is the worker's settings as parsed, before
// Config.validate derived anything from them: an outbox's derived values
// (its CloudEvents source, from its own database and collection) are its
// own.
func loadOutboxes(raw Config) ([]outboxConfig, error) {
	if raw.FleetFile == "" {
		c := raw
		if err := c.validate(); err != nil {
			return nil, err
		}
		resolveClaimIdleMax(&c, false)
		return []outboxConfig{{Name: implicitOutbox, Config: c}}, nil
	}
	entries, err := fleet.Load(raw.FleetFile)
	if err != nil {
		return nil, fmt.Errorf("%w: OUTBOX_FLEET_FILE %s", ErrUsage, err)
	}
	byEnv := map[string]setting{}
	for _, s := range settings() {
		byEnv[s.env] = s
	}
	out := make([]outboxConfig, 0, len(entries))
	for _, e := range entries {
		c := raw
		bad := func(field, value, why string) error {
			if byEnv[fleetFieldSettings[field]].secret || field == "mongo_uri" {
				value = redactSetting(value)
			}
			return fmt.Errorf("%w: OUTBOX_FLEET_FILE %s: line %d: outbox %q: %s %q: %s", ErrUsage, raw.FleetFile, e.Line, e.Name, field, value, why)
		}
		for _, s := range e.Settings() {
			if err := byEnv[fleetFieldSettings[s.Field]].parse(&c, strings.TrimSpace(s.Value)); err != nil {
				return nil, bad(s.Field, s.Value, err.Error())
			}
		}
		if err := validateEntry(&c, e); err != nil {
			var se *settingsError
			if errors.As(err, &se) {
				if field := fleetField(se.env); field != "" {
					return nil, bad(field, settingText(e, field), se.why)
				}
			}
			return nil, fmt.Errorf("%w: OUTBOX_FLEET_FILE %s: line %d: outbox %q: %v", ErrUsage, raw.FleetFile, e.Line, e.Name, err)
		}
		resolveClaimIdleMax(&c, true)
		out = append(out, outboxConfig{Name: e.Name, Databases: e.Databases, Config: c})
	}
	if err := checkDistinct(slices.DeleteFunc(slices.Clone(out), outboxConfig.template)); err != nil {
		return nil, fmt.Errorf("%w: OUTBOX_FLEET_FILE %s: %v", ErrUsage, raw.FleetFile, err)
	}
	return out, nil
}

// validateEntry validates c, the settings of the file's entry e. An
// entry of one database is validated as it will relay; an entry of a
// pattern is validated as each of its databases will be, and left as
// parsed, its database unset (outboxConfig.Databases).
func validateEntry(c *Config, e fleet.Outbox) error {
	if e.Databases == "" {
		return c.validate()
	}
	c.MongoDatabase = ""
	probe := *c
	probe.MongoDatabase = "discovered"
	return probe.validate()
}

// fleetField is the field of the fleet file that sets the setting env,
// or "" when the file cannot set it.
func fleetField(env string) string {
	for field, e := range fleetFieldSettings {
		if e == env {
			return field
		}
	}
	return ""
}

// settingText is the text the file gives field of e.
func settingText(e fleet.Outbox, field string) string {
	for _, s := range e.Settings() {
		if s.Field == field {
			return s.Value
		}
	}
	return ""
}

// sideSuffixes name the collections kept beside an outbox collection
// (its owners, fences, paused types, audit): per outbox, so that two
// outboxes of one database keep their partitions, fences and pauses apart.
var sideSuffixes = []string{mongo.OwnersSuffix, mongo.FencesSuffix, mongo.PausedSuffix, mongo.AuditSuffix}

// checkDistinct refuses two outboxes on one collection (they would share
// its partitions and claims under two names) and an outbox whose
// collection is another's side collection.
func checkDistinct(outboxes []outboxConfig) error {
	for i, a := range outboxes {
		if err := checkApart(a, outboxes[:i]); err != nil {
			return err
		}
	}
	return nil
}

// checkApart checks a against each of others as checkDistinct does.
func checkApart(a outboxConfig, others []outboxConfig) error {
	type where struct{ hosts, database string }
	place := func(c Config) where {
		hosts := c.MongoURI
		if u, err := url.Parse(c.MongoURI); err == nil {
			hosts = u.Host
		}
		return where{hosts, c.MongoDatabase}
	}
	for _, b := range others {
		if place(a.Config) != place(b.Config) {
			continue
		}
		if a.MongoCollection == b.MongoCollection {
			return fmt.Errorf("outbox %q: collection %q: outbox %q relays it already; want one outbox per collection", a.Name, a.MongoCollection, b.Name)
		}
		for _, s := range sideSuffixes {
			side, of := a, b
			if b.MongoCollection == a.MongoCollection+s {
				side, of = b, a
			}
			if side.MongoCollection == of.MongoCollection+s {
				return fmt.Errorf("outbox %q: collection %q is where the worker keeps outbox %q's %s in the same database; rename one",
					side.Name, side.MongoCollection, of.Name, strings.TrimPrefix(s, "_"))
			}
		}
	}
	return nil
}

// shareBatchBytes divides OUTBOX_BATCH_BYTES=auto's bound among the
// outboxes: it is what one batch may hold for the worker's memory limit,
// and every outbox may have a batch in flight at once.
func shareBatchBytes(outboxes []outboxConfig) {
	for i := range outboxes {
		if outboxes[i].BatchBytesAuto {
			outboxes[i].BatchBytes = max(outboxes[i].BatchBytes/len(outboxes), minBatchBytes)
		}
	}
}

// outboxNames lists the names of outboxes, for logs.
func outboxNames(outboxes []outboxConfig) []string {
	names := make([]string, len(outboxes))
	for i, o := range outboxes {
		names[i] = o.Name
	}
	return slices.Clip(names)
}

// selectOutbox points an operator command's cfg at the outbox named name
// (--outbox): without a fleet file the one outbox, named implicitOutbox;
// with one, the entry of that name, whose fields set those of the
// command's settings (chosen) that the file may set. A file of one
// outbox needs no name.
func selectOutbox(cfg *Config, name string, chosen []setting) error {
	if cfg.FleetFile == "" {
		if name != "" && name != implicitOutbox {
			return fmt.Errorf("%w: --outbox %q: OUTBOX_FLEET_FILE is unset, and the one outbox the settings describe is named %s", ErrUsage, name, implicitOutbox)
		}
		return nil
	}
	entries, err := fleet.Load(cfg.FleetFile)
	if err != nil {
		return fmt.Errorf("%w: OUTBOX_FLEET_FILE %s", ErrUsage, err)
	}
	if entry, db, ok := fleet.SplitDiscoveredName(name); ok {
		return selectDiscovered(cfg, entries, entry, db, chosen)
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name
	}
	i := slices.Index(names, name)
	switch {
	case name == "" && len(entries) == 1:
		i = 0
	case name == "":
		return fmt.Errorf("%w: OUTBOX_FLEET_FILE %s lists %d outboxes (%s): name one with --outbox", ErrUsage, cfg.FleetFile, len(entries), strings.Join(names, ", "))
	case i < 0:
		return fmt.Errorf("%w: --outbox %q: OUTBOX_FLEET_FILE %s lists no such outbox (it lists %s)%s", ErrUsage, name, cfg.FleetFile, strings.Join(names, ", "), didYouMean(name, names, "%s"))
	}
	cfg.Outbox = entries[i].Name
	return applyEntry(cfg, entries[i], chosen)
}

// selectDiscovered points cfg at the outbox that the entry named entry,
// one of a pattern of databases, relays in database db.
func selectDiscovered(cfg *Config, entries []fleet.Outbox, entry, db string, chosen []setting) error {
	i := slices.IndexFunc(entries, func(e fleet.Outbox) bool { return e.Name == entry })
	switch {
	case i < 0:
		return fmt.Errorf("%w: --outbox %q: OUTBOX_FLEET_FILE %s lists no outbox %q", ErrUsage, entry+"/"+db, cfg.FleetFile, entry)
	case entries[i].Databases == "":
		return fmt.Errorf("%w: --outbox %q: outbox %q of OUTBOX_FLEET_FILE %s names one database, not a pattern; name it --outbox %s", ErrUsage, entry+"/"+db, entry, cfg.FleetFile, entry)
	case !fleet.Matches(entries[i].Databases, db):
		return fmt.Errorf("%w: --outbox %q: database %q does not match outbox %q's pattern %q", ErrUsage, entry+"/"+db, db, entry, entries[i].Databases)
	}
	if err := applyEntry(cfg, entries[i], chosen); err != nil {
		return err
	}
	cfg.MongoDatabase, cfg.Outbox = db, entry+"/"+db
	return nil
}

// applyEntry sets those of cfg's settings (chosen) that the entry e sets.
func applyEntry(cfg *Config, e fleet.Outbox, chosen []setting) error {
	for _, s := range e.Settings() {
		j := slices.IndexFunc(chosen, func(c setting) bool { return c.env == fleetFieldSettings[s.Field] })
		if j < 0 {
			continue // a setting this command does not read
		}
		if err := chosen[j].parse(cfg, strings.TrimSpace(s.Value)); err != nil {
			value := s.Value
			if s.Field == "mongo_uri" {
				value = redactSetting(value)
			}
			return fmt.Errorf("%w: OUTBOX_FLEET_FILE %s: line %d: outbox %q: %s %q: %s", ErrUsage, cfg.FleetFile, e.Line, e.Name, s.Field, value, err)
		}
	}
	return nil
}

// everyOutbox is each outbox of the fleet file that names its database,
// cfg pointed at it as selectOutbox points an operator command's:
// `worker console` without --outbox serves them all. An entry of a
// pattern of databases is left out (its tenants are not known before the
// console lists the cluster's databases; `worker console --outbox
// <entry>/<database>` opens one); a file of patterns alone is refused,
// saying so.
func everyOutbox(cfg Config, chosen []setting) ([]outboxConfig, error) {
	entries, err := fleet.Load(cfg.FleetFile)
	if err != nil {
		return nil, fmt.Errorf("%w: OUTBOX_FLEET_FILE %s", ErrUsage, err)
	}
	out := make([]outboxConfig, 0, len(entries))
	var patterns []string
	for _, e := range entries {
		if e.Databases != "" {
			patterns = append(patterns, e.Name)
			continue
		}
		c := cfg
		if err := selectOutbox(&c, e.Name, chosen); err != nil {
			return nil, err
		}
		out = append(out, outboxConfig{Name: e.Name, Config: c})
	}
	if len(out) == 0 && len(patterns) > 0 {
		return nil, fmt.Errorf("%w: OUTBOX_FLEET_FILE %s: outboxes %s name patterns of databases, which worker console does not list: open one with --outbox <outbox>/<database>", ErrUsage, cfg.FleetFile, strings.Join(patterns, ", "))
	}
	return out, nil
}

// parseClaimIdleMax parses OUTBOX_CLAIM_IDLE_MAX: auto (0), or a
// duration of at least claim.DelayMin.
func parseClaimIdleMax(c *Config, v string) error {
	if v == "auto" {
		c.ClaimIdleMax = 0
		return nil
	}
	return parseDurationAtLeast(&c.ClaimIdleMax, v, claim.DelayMin)
}

// resolveClaimIdleMax gives OUTBOX_CLAIM_IDLE_MAX=auto its value. In a
// fleet idle claims back off to claim.IdleMaxDefault: what 200 idle
// outboxes cost the database is the fleet's concern. One outbox keeps
// claiming on its schedule, as it always did: without a change stream
// (a standalone server), and for the events an operator puts back to NEW
// (a requeue, a resume), which no stream reports, its first event would
// otherwise wait up to the back-off, for a saving of one find a tick.
func resolveClaimIdleMax(c *Config, fleet bool) {
	switch {
	case c.ClaimIdleMax != 0:
	case fleet:
		c.ClaimIdleMax = claim.IdleMaxDefault
	default:
		c.ClaimIdleMax = claim.DelayMin // at or below the schedule's period: no back-off
	}
}
