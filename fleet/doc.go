// Package fleet reads the file that lists the outboxes one worker relays:
// each outbox's name, where its events are (a MongoDB URI, a database and
// a collection), where they go (an exchange), and the settings it sets
// apart from the worker's. It checks what a file alone can tell (its
// syntax, unknown fields, names, required fields) and leaves each
// setting's value to the worker, which parses it as it parses the same
// setting's environment variable, so that a value means the same in both
// places.
package fleet
