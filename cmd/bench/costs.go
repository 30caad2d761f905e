package main

import "fmt"

// The worker's own costs per event, read from the drains' figures: they
// carry over to MongoDB where the rates do not. Each is a stage of its
// own in the table, with its targets, but measures nothing itself.

// Target names of the costs.
const (
	targetCommands = "database commands per 1,000 events"
	targetCPU      = "worker CPU per 1,000 events"
	targetRSS      = "worker peak RSS"
)

func targetScaleCommands(n int) string {
	return fmt.Sprintf("%d replicas vs 1: commands per 1,000 events", n)
}

// commandsStage: the workers' database commands per 1,000 events.
var commandsStage = stage{rows: commandsRows, targets: commandsTargets}

// cpuStage: the workers' CPU per 1,000 events, against the raw
// publisher's.
var cpuStage = stage{rows: cpuRows, targets: cpuTargets}

// memoryStage: the largest peak RSS of every drain and latency worker.
var memoryStage = stage{rows: memoryRows, targets: memoryTargets}

func commandsRows(r *Results, add addRow) {
	drains := drainsFig.value(r)
	batch := r.Config.BatchSize
	for _, d := range drains {
		target, result := targetCommands, fmt.Sprintf("%.1f %s", d.DBCommandsPer1000, topCommands(d.DBCommands, 4))
		if d.Replicas > 1 {
			target = targetScaleCommands(d.Replicas)
			if one, ok := drainOf(drains, 1); ok && one.DBCommandsPer1000 > 0 {
				result += fmt.Sprintf("; %.2fx the 1-replica figure", ratio(d.DBCommandsPer1000, one.DBCommandsPer1000))
			}
		}
		add(fmt.Sprintf("Database commands per 1,000 events, %d replica%s (batch %d%s)", d.Replicas, plural(d.Replicas), batch, prefixed(", OUTBOX_ORDERING=", d.Ordering)),
			result, target)
	}
	for _, d := range unorderedFig.value(r) {
		add(fmt.Sprintf("Database commands per 1,000 events, %d replica%s, ordering off (batch %d, OUTBOX_ORDERING=%s)", d.Replicas, plural(d.Replicas), batch, d.Ordering),
			fmt.Sprintf("%.1f %s", d.DBCommandsPer1000, topCommands(d.DBCommands, 4)), "")
	}
}

// commandsTargets: at most 20 commands per 1,000 events with one replica,
// at most scaleCommandsMax times that with more.
func commandsTargets(r *Results, add addTarget) {
	drains := drainsFig.value(r)
	one, ok := drainOf(drains, 1)
	if !ok {
		return
	}
	if rawDBFig.value(r).PerSecond > 0 {
		add(targetCommands, "<= 20", fmt.Sprintf("%.1f", one.DBCommandsPer1000), one.DBCommandsPer1000 <= 20)
	}
	if one.PerSecond <= 0 || one.DBCommandsPer1000 <= 0 {
		return
	}
	for _, d := range drains {
		if d.Replicas == 1 {
			continue
		}
		cmds := d.DBCommandsPer1000 / one.DBCommandsPer1000
		add(targetScaleCommands(d.Replicas), fmt.Sprintf("<= %.0fx", scaleCommandsMax), fmt.Sprintf("%.2fx", cmds), cmds <= scaleCommandsMax)
	}
}

func cpuRows(r *Results, add addRow) {
	floor := rawBrokerCPUFig.value(r)
	for _, d := range drainsFig.value(r) {
		target := ""
		if d.Replicas == 1 {
			target = targetCPU
		}
		result := fmt.Sprintf("%.1f ms (%.2f s in all)", d.CPUMsPer1000, d.CPUSeconds)
		if floor > 0 {
			result += fmt.Sprintf(", %.1fx the raw publisher's", d.CPUMsPer1000/floor)
		}
		add(fmt.Sprintf("Worker CPU per 1,000 events, %d replica%s drain (user+sys, rusage)", d.Replicas, plural(d.Replicas)),
			result, target)
	}
	if floor > 0 {
		add("Raw publisher CPU per 1,000 messages (the harness's own, rusage): this host's floor for a confirmed publish",
			fmt.Sprintf("%.1f ms", floor), "")
	}
}

// cpuTargets: at most 40 ms of CPU per 1,000 events with one replica.
func cpuTargets(r *Results, add addTarget) {
	if one, ok := drainOf(drainsFig.value(r), 1); ok && rawDBFig.value(r).PerSecond > 0 {
		add(targetCPU, "<= 40 ms", fmt.Sprintf("%.1f ms", one.CPUMsPer1000), one.CPUMsPer1000 <= 40)
	}
}

// peakRSS is the largest RSS of any drain or latency worker process.
func peakRSS(r *Results) float64 {
	var m float64
	for _, d := range drainsFig.value(r) {
		m = max(m, d.PeakRSSMB)
	}
	for _, l := range latencyFig.value(r) {
		m = max(m, l.PeakRSSMB)
	}
	return m
}

func memoryRows(r *Results, add addRow) {
	if rss := peakRSS(r); rss > 0 {
		add("Worker peak RSS (largest VmHWM of every drain and latency worker process)", fmt.Sprintf("%.1f MB", rss), targetRSS)
	}
}

// memoryTargets: below 100 MB.
func memoryTargets(r *Results, add addTarget) {
	if rss := peakRSS(r); rss > 0 {
		add(targetRSS, "< 100 MB", fmt.Sprintf("%.1f MB", rss), rss < 100)
	}
}
