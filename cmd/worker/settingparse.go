package main

// The parsers every setting shares: each stores a valid value in the
// Config or says what it wants instead.

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/outboxrelay/outbox/schedule"
)

func nonEmpty(dst *string, v string) error {
	if v == "" {
		return errors.New("must not be empty")
	}
	*dst = v
	return nil
}

func oneOf(dst *string, v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			*dst = v
			return nil
		}
	}
	return fmt.Errorf("want one of %s", strings.Join(allowed, ", "))
}

func parseBool(dst *bool, v string) error {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return errors.New("want true or false")
	}
	*dst = b
	return nil
}

func parseInt(dst *int, v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return errors.New("want a whole number")
	}
	*dst = n
	return nil
}

func parseIntBetween(dst *int, v string, lo, hi int) error {
	var n int
	if err := parseInt(&n, v); err != nil {
		return err
	}
	if n < lo || n > hi {
		return fmt.Errorf("want %d to %d", lo, hi)
	}
	*dst = n
	return nil
}

func parseDuration(dst *time.Duration, v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return errors.New("want a duration such as 30s, 5m or 168h")
	}
	*dst = d
	return nil
}

// parseDurationAtLeast is parseDuration with a least value.
func parseDurationAtLeast(dst *time.Duration, v string, least time.Duration) error {
	var d time.Duration
	if err := parseDuration(&d, v); err != nil {
		return err
	}
	if d < least {
		return fmt.Errorf("want at least %s", least)
	}
	*dst = d
	return nil
}

func parseSchedule(dst *string, v string) error {
	if _, err := schedule.Parse(v); err != nil {
		return errors.New("want a cron schedule: five fields such as */2 * * * *, or @every 1s")
	}
	*dst = v
	return nil
}

func parseAddr(dst *string, v string) error {
	if _, _, err := net.SplitHostPort(v); err != nil {
		return errors.New("want host:port or :port")
	}
	*dst = v
	return nil
}
