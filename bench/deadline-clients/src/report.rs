//! The one JSON object the program prints: its keys and units are what bench/measure.py reads
//! (the module doc of main.rs lists them).

use serde_json::{json, Map, Value};
use tokio::time::Instant;

use crate::cli::{Args, Mode};
use crate::clients::{Ending, Outcome};

/// The percentiles reported, with their keys.
const PERCENTILES: [(&str, f64); 4] = [("50", 50.0), ("90", 90.0), ("99", 99.0), ("99.9", 99.9)];

/// The run's figures: `began` is when the first request was due, `wall_s` the seconds from then
/// to the end of the last request, `cpu_s` this process's CPU time over the run.
pub fn report(args: &Args, began: Instant, outcomes: &[Outcome], wall_s: f64, cpu_s: f64) -> Value {
    let count = |ending| outcomes.iter().filter(|outcome| outcome.ending == ending).count();
    let good: Vec<&Outcome> = outcomes.iter().filter(|outcome| outcome.ending == Ending::Good).collect();
    let since_began = |instant: Instant| instant.saturating_duration_since(began).as_secs_f64();
    let good_latencies: Vec<f64> = good.iter().map(|outcome| (outcome.ended - outcome.started).as_secs_f64()).collect();

    let mut good_per_second = vec![0u64; (args.seconds + args.deadline).ceil() as usize];
    for outcome in &good {
        let second = (since_began(outcome.ended) as usize).min(good_per_second.len() - 1);
        good_per_second[second] += 1;
    }
    let good_counted = match args.mode {
        Mode::Open => good.len(),
        // The answers to the last requests, after --seconds, would add to the rate.
        Mode::Closed => good.iter().filter(|outcome| since_began(outcome.ended) < args.seconds).count(),
    };

    let first_start = outcomes.iter().map(|outcome| outcome.started).min();
    let last_start = outcomes.iter().map(|outcome| outcome.started).max();
    let arrival_rps = match (first_start, last_start) {
        (Some(first), Some(last)) if last > first => Some((outcomes.len() - 1) as f64 / (last - first).as_secs_f64()),
        _ => None,
    };
    let lateness: Vec<f64> =
        outcomes.iter().filter_map(|outcome| outcome.lateness).map(|late| late.as_secs_f64()).collect();
    let mut lateness_ms = percentiles_ms(&lateness);
    if let Some(max) = lateness.iter().copied().reduce(f64::max) {
        lateness_ms.insert("max".to_owned(), json!(max * 1000.0));
    }

    json!({
        "mode": args.mode.name(),
        "seconds": args.seconds,
        "deadline_s": args.deadline,
        "rate": args.rate,
        "concurrency": args.concurrency,
        "sent": outcomes.len(),
        "good": good.len(),
        "shed": count(Ending::Shed),
        "other_status": count(Ending::OtherStatus),
        "late": count(Ending::Late),
        "refused": count(Ending::Refused),
        "reset": count(Ending::Reset),
        "good_rps": good_counted as f64 / args.seconds,
        "good_per_second": good_per_second,
        "good_latency_ms": percentiles_ms(&good_latencies),
        "good_max_ms": good_latencies.iter().copied().reduce(f64::max).map(|max| max * 1000.0),
        "good_mean_ms": (!good_latencies.is_empty())
            .then(|| good_latencies.iter().sum::<f64>() / good_latencies.len() as f64 * 1000.0),
        "arrival_rps": arrival_rps,
        "lateness_ms": lateness_ms,
        "cpu_percent": 100.0 * cpu_s / wall_s,
        "wall_s": wall_s,
    })
}

/// {"50": ms, ...}: the nearest-rank percentiles of `seconds`, in milliseconds; empty without any.
fn percentiles_ms(seconds: &[f64]) -> Map<String, Value> {
    let mut ordered = seconds.to_vec();
    ordered.sort_by(f64::total_cmp);
    let mut points = Map::new();
    if ordered.is_empty() {
        return points;
    }
    for (key, percentile) in PERCENTILES {
        let rank = ((percentile / 100.0 * ordered.len() as f64) as usize).min(ordered.len() - 1);
        points.insert(key.to_owned(), json!(ordered[rank] * 1000.0));
    }
    points
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn nearest_rank_percentiles() {
        let seconds: Vec<f64> = (1..=1000).rev().map(|ms| ms as f64 / 1000.0).collect();
        let points = percentiles_ms(&seconds);
        let at = |key: &str| points[key].as_f64().unwrap();
        assert_eq!((at("50"), at("90"), at("99"), at("99.9")), (501.0, 901.0, 991.0, 1000.0));
        assert!(percentiles_ms(&[]).is_empty());
    }

    fn outcome(began: Instant, started_ms: u64, ended_ms: u64, ending: Ending) -> Outcome {
        Outcome {
            started: began + Duration::from_millis(started_ms),
            lateness: Some(Duration::from_millis(started_ms % 3)),
            ending,
            ended: began + Duration::from_millis(ended_ms),
        }
    }

    #[test]
    fn the_figures() {
        let args = Args {
            mode: Mode::Open,
            url: String::new(),
            seconds: 2.0,
            deadline: 1.0,
            rate: Some(2.0),
            concurrency: 16,
        };
        let began = Instant::now();
        let outcomes = [
            outcome(began, 0, 100, Ending::Good),
            outcome(began, 500, 1000, Ending::Shed),
            outcome(began, 1000, 2000, Ending::Late),
            outcome(began, 1500, 2900, Ending::Good),
        ];
        let report = report(&args, began, &outcomes, 3.0, 0.3);
        assert_eq!(report["sent"], 4);
        assert_eq!(
            (report["good"].as_u64(), report["shed"].as_u64(), report["late"].as_u64()),
            (Some(2), Some(1), Some(1))
        );
        assert_eq!(report["good_rps"], 1.0);
        assert_eq!(report["good_per_second"], json!([1, 0, 1]));
        assert_eq!(report["arrival_rps"], 2.0);
        assert_eq!(report["good_max_ms"], 1400.0);
        assert_eq!(report["good_mean_ms"], 750.0);
        assert_eq!(report["lateness_ms"]["max"], 2.0);
        assert!((report["cpu_percent"].as_f64().unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(report["rate"], 2.0);
        assert_eq!(report["mode"], "open");
    }
}
