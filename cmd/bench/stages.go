package main

// stages are every stage of the harness, in the order they run and
// appear in the table and in bench.json. Without -only every stage with a
// key runs but the opt-in ones; the stages without a key report side
// measurements of the others.
func stages() []stage {
	return []stage{
		rawBrokerStage,
		publishStageDef,
		rawDBStage,
		drainStage(orderingAggregate),
		drainStage(orderingNone),
		commandsStage,
		cpuStage,
		samplerStage,
		profileStage,
		hotAggregateStage,
		skewedProducersStage,
		latencyStage,
		memoryStage,
		claimStage,
		retentionStage,
		claimBackoffStage,
		heldAggregatesStage,
		largeDocsStage,
		inboxStage,
		consolePagesStage,
		tracingStage,
		slowDBStage("db-latency-100ms", false),
		slowDBStage("db-latency-600ms", false),
		// On FerretDB each of these takes from several minutes to over
		// half an hour: make bench-slow runs them.
		slowDBStage("backlog-20k", true),
		slowDBStage("backlog-20k-busy", true),
		slowDBStage("backlog-20k-skipped", true),
		slowDBStage("backlog-50k", true),
		// Four replicas behind a head they may not take: opt-in, minutes
		// per build on FerretDB at the sizes (make
		// bench-starvation).
		starvationStage("paused-head"),
		starvationStage("held-head"),
		// A fleet of 200 idle outboxes in 20 databases: several minutes
		// (make bench-fleet).
		fleetIdleStage,
		fleetFairStage,
		// What PostgreSQL read under FerretDB for the runs above.
		tableReadsStage,
	}
}
