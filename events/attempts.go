package events

// MaxAttemptsDefault is how many claims an event gets before it becomes
// FAILED: both the claimer (failed publishes) and recovery (stale claims)
// count against it, so they share one default.
const MaxAttemptsDefault = 10
