//! The evaluation's plots, as PNG files beside `docs/evaluation.md`.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;

use crate::report::{correct, percentile, Results};
use crate::strategy::Strategy;

/// The font every plot's text is drawn with (Debian's fonts-dejavu-core).
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const SIZE: (u32, u32) = (900, 500);

fn font() -> Result<()> {
    static ONCE: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let bytes = std::fs::read(FONT).map_err(|e| format!("{FONT}: {e}"))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("{FONT}: not a usable font"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("{e:?}")
}

fn label(names: &[String]) -> impl Fn(&SegmentValue<usize>) -> String + '_ {
    move |v| match v {
        SegmentValue::CenterOf(i) => names.get(*i).cloned().unwrap_or_default(),
        _ => String::new(),
    }
}

/// Writes every plot into `dir`; returns the file names.
pub fn all(results: &Results, dir: &Path) -> Result<Vec<String>> {
    font()?;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mut made = Vec::new();
    for (name, f) in [
        (
            "eval-correctness.png",
            correctness as fn(&Results, &Path) -> Result<bool>,
        ),
        ("eval-kinds.png", kinds),
        ("eval-latency.png", latency),
        ("eval-density.png", density),
    ] {
        if f(results, &dir.join(name)).with_context(|| format!("plot {name}"))? {
            made.push(name.to_string());
        }
    }
    Ok(made)
}

fn correctness(r: &Results, path: &Path) -> Result<bool> {
    let mut names = Vec::new();
    let mut shares = Vec::new();
    for s in Strategy::RECOVERING {
        let runs: Vec<_> = r.crashes.iter().filter(|o| o.strategy == s).collect();
        if runs.is_empty() {
            continue;
        }
        let ok = runs
            .iter()
            .filter(|o| r.reference_of(&o.trajectory).is_some_and(|p| correct(o, p)))
            .count();
        names.push(s.name().to_string());
        shares.push(100.0 * ok as f64 / runs.len() as f64);
    }
    if names.is_empty() {
        return Ok(false);
    }
    bars(
        path,
        "Recovery correctness after a crash",
        &names,
        &shares,
        100.0,
        "runs correct (%)",
    )?;
    Ok(true)
}

/// A bar chart: one bar per name.
fn bars(
    path: &Path,
    caption: &str,
    names: &[String],
    values: &[f64],
    top: f64,
    y: &str,
) -> Result<()> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((0..names.len() - 1).into_segmented(), 0f64..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&label(names))
        .y_desc(y)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(RGBColor(40, 110, 180).filled())
                .margin(24)
                .data(values.iter().enumerate().map(|(i, v)| (i, *v))),
        )
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn kinds(r: &Results, path: &Path) -> Result<bool> {
    let mut categories: Vec<String> = r
        .references
        .iter()
        .map(|x| x.trajectory.category.clone())
        .collect();
    categories.sort();
    categories.dedup();
    if categories.is_empty() {
        return Ok(false);
    }
    let shares: Vec<[f64; 4]> = categories
        .iter()
        .map(|c| {
            let mut k = [0f64; 4];
            for x in r.references.iter().filter(|x| &x.trajectory.category == c) {
                let m = x.crab.kinds;
                k[0] += m.skip as f64;
                k[1] += m.fs_only as f64;
                k[2] += m.process_only as f64;
                k[3] += m.full as f64;
            }
            let n: f64 = k.iter().sum::<f64>().max(1.0);
            k.map(|v| 100.0 * v / n)
        })
        .collect();
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Turns by checkpoint kind (Crab)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((0..categories.len() - 1).into_segmented(), 0f64..100f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&label(&categories))
        .y_desc("turns (%)")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let colors = [
        RGBColor(120, 190, 120),
        RGBColor(90, 150, 210),
        RGBColor(230, 170, 60),
        RGBColor(200, 80, 80),
    ];
    for (j, name) in ["skip", "fs-only", "process-only", "full"]
        .iter()
        .enumerate()
    {
        let color = colors[j];
        chart
            .draw_series(shares.iter().enumerate().map(|(i, k)| {
                let lo: f64 = k[..j].iter().sum();
                Rectangle::new(
                    [
                        (SegmentValue::Exact(i), lo),
                        (SegmentValue::Exact(i + 1), lo + k[j]),
                    ],
                    color.filled(),
                )
            }))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(true)
}

fn latency(r: &Results, path: &Path) -> Result<bool> {
    let crab: Vec<f64> = r
        .references
        .iter()
        .flat_map(|x| x.crab.checkpoint_ms.clone())
        .collect();
    let runc: Vec<f64> = r
        .crashes
        .iter()
        .filter(|o| o.strategy == Strategy::RuncFull)
        .flat_map(|o| o.checkpoint_ms.clone())
        .collect();
    let mut names = Vec::new();
    let mut values = Vec::new();
    for (who, v) in [("crab", &crab), ("runc-full", &runc)] {
        if v.is_empty() {
            continue;
        }
        for (q, p) in [("p50", 0.5), ("p95", 0.95), ("p99", 0.99)] {
            names.push(format!("{who} {q}"));
            values.push(percentile(v, p));
        }
    }
    if values.is_empty() {
        return Ok(false);
    }
    let top = values.iter().cloned().fold(1.0, f64::max) * 1.1;
    bars(
        path,
        "Checkpoint latency per turn (skips excluded)",
        &names,
        &values,
        top,
        "ms",
    )?;
    Ok(true)
}

/// One line of the density plot: its figure of a [`crate::report::Density`].
type Seconds = fn(&crate::report::Density) -> f64;

fn density(r: &Results, path: &Path) -> Result<bool> {
    if r.densities.is_empty() {
        return Ok(false);
    }
    let xmax = r.densities.iter().map(|d| d.n).max().unwrap_or(1) as f64;
    let ymax = r
        .densities
        .iter()
        .map(|d| d.plain.max(d.crab).max(d.crab_crash).as_secs_f64())
        .fold(1.0, f64::max)
        * 1.15;
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption("End-to-end time of one run at density", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..xmax * 1.05, 0f64..ymax)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("sandboxes at once")
        .y_desc("mean seconds per run")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let lines: [(&str, RGBColor, Seconds); 3] = [
        ("no Crab, fault-free", RGBColor(120, 120, 120), |d| {
            d.plain.as_secs_f64()
        }),
        ("Crab, fault-free", RGBColor(40, 110, 180), |d| {
            d.crab.as_secs_f64()
        }),
        ("Crab, one crash", RGBColor(200, 80, 80), |d| {
            d.crab_crash.as_secs_f64()
        }),
    ];
    for (name, color, f) in lines {
        let points: Vec<(f64, f64)> = r.densities.iter().map(|d| (d.n as f64, f(d))).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(err)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Density, Reference};
    use crate::run::{Kinds, Outcome};
    use crate::state::Ending;
    use crate::trajectory::Trajectory;
    use std::sync::Arc;
    use std::time::Duration;

    fn outcome(name: &str, s: Strategy, digest: &str, kinds: Kinds) -> Outcome {
        Outcome {
            trajectory: name.into(),
            category: "build".into(),
            strategy: s,
            crash_at: None,
            ending: Ok(Ending {
                verified: true,
                digest: digest.into(),
            }),
            elapsed: Duration::from_secs(3),
            recovery: None,
            kinds,
            checkpoint_ms: vec![20.0, 30.0, 200.0],
            gating_ms: Some((0.0, 12.0)),
            bytes: 1 << 20,
            incomplete: 0,
            resumed_at: None,
        }
    }

    #[test]
    fn every_plot_is_written_as_a_png() {
        let t: Trajectory = serde_json::from_value(serde_json::json!({"format": 1, "name": "a",
            "title": "x", "category": "build", "image": "i", "workdir": "/w",
            "turns": [{"think_ms": 1000, "tool": "shell", "command": "ls"}],
            "verify": "true", "state": {"paths": []}}))
        .unwrap();
        let kinds = Kinds {
            skip: 5,
            fs_only: 3,
            process_only: 1,
            full: 1,
        };
        let mut r = Results::default();
        r.references.push(Reference {
            trajectory: Arc::new(t),
            plain: outcome("a", Strategy::Plain, "d1", Kinds::default()),
            crab_plain: outcome("a", Strategy::CrabPlain, "d1", Kinds::default()),
            crab: outcome("a", Strategy::Crab, "d1", kinds),
        });
        r.crashes.push(outcome("a", Strategy::Crab, "d1", kinds));
        r.crashes
            .push(outcome("a", Strategy::ChatOnly, "d2", Kinds::default()));
        r.crashes
            .push(outcome("a", Strategy::RuncFull, "d1", Kinds::default()));
        for n in [1, 4] {
            r.densities.push(Density {
                n,
                plain: Duration::from_secs(3),
                crab_plain: Duration::from_secs(3),
                crab: Duration::from_secs(3),
                crab_crash: Duration::from_secs(4),
                correct: n,
            });
        }
        let dir = std::env::temp_dir().join(format!("plots-{}", std::process::id()));
        let made = all(&r, &dir).unwrap();
        assert_eq!(made.len(), 4, "{made:?}");
        for f in made {
            let bytes = std::fs::read(dir.join(&f)).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f}");
        }
        if std::env::var_os("KEEP_PLOTS").is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }
}
