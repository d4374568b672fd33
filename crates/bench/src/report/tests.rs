use super::*;
use crate::harness::Latency;
use plotters::prelude::{BitMapBackend, IntoDrawingArea};

fn point(protocol: &str, threads: usize, tps: f64) -> Point {
    let latency = |p50: f64| Latency {
        p50,
        p90: p50 * 1.5,
        p99: p50 * 3.0,
        max: p50 * 10.0,
        samples: 100,
    };
    Point {
        workload: "tpcc".into(),
        protocol: protocol.into(),
        nodes: 1,
        transport: "none".into(),
        threads,
        objects: 1,
        read_ratio: 0.5,
        balance_k: None,
        nesting: "flat".into(),
        inner: 1,
        queries: None,
        warehouses: Some(2),
        mix: Some("standard".into()),
        scale: Some("small".into()),
        contention: "Backoff".into(),
        oss_commit: None,
        link_delay_ms: 0.0,
        answer_poll_us: None,
        busy_poll_us: None,
        processes: false,
        fibers: false,
        runtime_threads: None,
        linked: 0,
        throughput_tps: tps,
        abort_rate: 0.01 * threads as f64,
        latency_us: latency(10.0),
        profiles: ["new-order", "payment", "delivery"]
            .iter()
            .zip([20.0, 3.0, 100.0])
            .map(|(name, p50)| ProfileReport {
                name: name.to_string(),
                committed: 10,
                share: 0.3,
                throughput_tps: tps / 3.0,
                latency_us: latency(p50),
            })
            .collect(),
        invariant_ok: true,
        sched: None,
        cmax: None,
        turnaround_us: None,
    }
}

#[test]
fn the_varying_setting_is_the_x_axis_and_repeated_runs_are_medians() {
    let points = vec![
        point("local", 1, 100.0),
        point("local", 2, 150.0),
        point("local", 2, 190.0),
        point("local", 2, 170.0),
        point("tfa", 1, 50.0),
        point("tfa", 2, 60.0),
    ];
    let figures = series::figures(&points);
    assert_eq!(figures.len(), 3, "throughput, aborts, latency");
    let Figure::Lines {
        x_label, xs, lines, ..
    } = &figures[0]
    else {
        panic!("throughput is a line figure");
    };
    assert_eq!(x_label, "threads per node");
    assert_eq!(xs, &vec![1.0, 2.0]);
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0].label, "local");
    assert_eq!(lines[0].points, vec![(1.0, 100.0), (2.0, 170.0)]);
    let Figure::Bars { groups, series, .. } = &figures[2] else {
        panic!("latency is a bar figure");
    };
    assert_eq!(groups, &["new-order", "payment", "delivery"]);
    assert_eq!(series[1].label, "tfa");
    assert_eq!(series[1].values[2], (100.0, 300.0));
}

/// Dark pixels in a PNG region: text drawn with the bundled font shows up there.
fn dark_pixels(rgb: &[u8], width: usize, rows: std::ops::Range<usize>) -> usize {
    rows.flat_map(|y| (0..width).map(move |x| (y * width + x) * 3))
        .filter(|&i| rgb[i] < 100 && rgb[i + 1] < 100 && rgb[i + 2] < 100)
        .count()
}

#[test]
fn figures_render_as_svg_and_png_with_text() {
    let dir = std::env::temp_dir().join(format!("atomos-report-{}", std::process::id()));
    let points = vec![point("local", 1, 1000.0), point("local", 4, 3500.0)];
    let written = render(&points, &dir).unwrap();
    assert_eq!(written.len(), 6, "{written:?}");
    for path in &written {
        let bytes = std::fs::metadata(path).unwrap().len();
        assert!(bytes > 2_000, "{} has {bytes} bytes", path.display());
    }
    let svg = std::fs::read_to_string(dir.join("tpcc-throughput.svg")).unwrap();
    assert!(svg.contains("tpcc: throughput"));
    assert!(svg.contains("threads per node"));
    // The title is drawn in the PNG: the band above the plot holds dark pixels.
    let mut rgb = vec![255u8; 960 * 600 * 3];
    {
        let root = BitMapBackend::with_buffer(&mut rgb, (960, 600)).into_drawing_area();
        let figure = series::figures(&points).remove(0);
        plot::draw_for_test(root, &figure).unwrap();
    }
    assert!(
        dark_pixels(&rgb, 960, 10..45) > 200,
        "no caption text was drawn"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_files_get_clear_errors() {
    let dir = std::env::temp_dir().join(format!("atomos-report-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{\"workload\": 3}").unwrap();
    assert!(matches!(load(&[junk]), Err(ReportError::Parse { .. })));
    assert!(matches!(
        load(&[dir.join("missing.json")]),
        Err(ReportError::Read { .. })
    ));
    assert!(matches!(load(&[]), Err(ReportError::Empty)));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn open_loop_runs_draw_turnaround_per_priority_and_the_speedup_over_none() {
    let run = |sched: &str, cmax: Option<u32>, scale: f64| {
        let mut p = point("local", 1, 1000.0);
        p.sched = Some(sched.into());
        p.cmax = cmax;
        p.turnaround_us = Some(
            (1..=5u8)
                .map(|l| {
                    let mean = scale * f64::from(10 - l);
                    (
                        l.to_string(),
                        Turnaround {
                            mean,
                            p99: mean * 4.0,
                        },
                    )
                })
                .collect(),
        );
        p
    };
    let points = vec![
        run("none", None, 10.0),
        run("preemptive", None, 5.0),
        run("preemptive", None, 4.0),
        run("preemptive", None, 6.0),
        run("cmax", Some(4), 2.0),
    ];
    let figures = sched::figures(&points);
    assert_eq!(figures.len(), 2);
    let Figure::Lines { lines, xs, .. } = &figures[0] else {
        panic!("lines expected");
    };
    assert_eq!(xs, &vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    let labels: Vec<&str> = lines.iter().map(|l| l.label.as_str()).collect();
    assert_eq!(labels, ["none", "preemptive", "cmax (C_max 4)"]);
    // Priority 5: none 50, preemptive the median of 25, 20 and 30.
    assert_eq!(lines[1].points[4], (5.0, 25.0));
    let Figure::Lines { lines, .. } = &figures[1] else {
        panic!("lines expected");
    };
    assert_eq!(lines[0].points[4], (5.0, 2.0));
    assert_eq!(lines[1].points[0], (1.0, 5.0));
    // Closed-loop results draw no such figure.
    assert!(sched::figures(&[point("local", 1, 1.0)]).is_empty());
}
