// Package rule is how a package's Config says which field it refuses:
// each Validate returns an *Error that names the Config, the field, its
// value and what the field accepts. A Validate lists its rules, one a
// field, made with the functions below, and First reports the first one
// broken.
//
// It is the relay's internal/rule, copied: this module cannot import the
// relay's packages (the relay's module requires this one), and the inbox's
// Config must refuse in the relay's words. Change both together.
package rule

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// Error is a Config field whose value its package refuses.
type Error struct {
	// Config names whose Config it is: the package, e.g. "claim".
	Config string
	// Field is the Go name of the field, e.g. "BatchSize".
	Field string
	// Value is the value refused; nil for a required field left unset.
	Value any
	// Want says what the field accepts, e.g. "1 to 10000".
	Want string
}

// Error reads "claim: BatchSize 0: want 1 to 10000".
func (e *Error) Error() string {
	if e.Value == nil {
		return fmt.Sprintf("%s: %s is required", e.Config, e.Field)
	}
	return fmt.Sprintf("%s: %s %s: want %s", e.Config, e.Field, show(e.Value), e.Want)
}

// show formats a value, a string quoted so that an empty or blank one
// shows.
func show(v any) string {
	if s, ok := v.(string); ok {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprint(v)
}

// First returns the first broken rule (one that is not nil), as an error
// of config's Config, or nil when none is. Every rule is evaluated before
// First is called, so none may rely on another one holding.
func First(config string, rules ...*Error) error {
	for _, e := range rules {
		if e != nil {
			e.Config = config
			return e
		}
	}
	return nil
}

// Check is the rule "ok": for what the rules below do not express, want
// says what the field named name accepts.
func Check(name string, ok bool, value any, want string) *Error {
	if ok {
		return nil
	}
	return &Error{Field: name, Value: value, Want: want}
}

// Required is the rule "the field is set".
func Required(name string, set bool) *Error {
	if set {
		return nil
	}
	return &Error{Field: name, Want: "a value"}
}

// Between is the rule lo <= v <= hi.
func Between[T cmp.Ordered](name string, v, lo, hi T) *Error {
	if lo <= v && v <= hi {
		return nil
	}
	return &Error{Field: name, Value: v, Want: fmt.Sprintf("%v to %v", lo, hi)}
}

// AtLeast is the rule v >= lo.
func AtLeast[T cmp.Ordered](name string, v, lo T) *Error {
	if v >= lo {
		return nil
	}
	return &Error{Field: name, Value: v, Want: fmt.Sprintf("at least %v", lo)}
}

// Above is the rule v > lo.
func Above[T cmp.Ordered](name string, v, lo T) *Error {
	if v > lo {
		return nil
	}
	return &Error{Field: name, Value: v, Want: fmt.Sprintf("more than %v", lo)}
}

// AtLeastField is the rule v >= lo, where lo is the value of the field
// named other.
func AtLeastField[T cmp.Ordered](name string, v T, other string, lo T) *Error {
	if v >= lo {
		return nil
	}
	return &Error{Field: name, Value: v, Want: fmt.Sprintf("at least %s (%v)", other, lo)}
}

// AboveField is the rule v > lo, where lo is the value of the field named
// other.
func AboveField[T cmp.Ordered](name string, v T, other string, lo T) *Error {
	if v > lo {
		return nil
	}
	return &Error{Field: name, Value: v, Want: fmt.Sprintf("more than %s (%v)", other, lo)}
}

// OneOf is the rule "v is one of allowed".
func OneOf(name, v string, allowed ...string) *Error {
	if slices.Contains(allowed, v) {
		return nil
	}
	return &Error{Field: name, Value: v, Want: "one of " + strings.Join(allowed, ", ")}
}
