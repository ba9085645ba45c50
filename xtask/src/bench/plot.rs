//! The report's PNG charts: one figure against the node count (log scale) per chart, one line per operator and
//! figure, the driver upgrade's nodes in flight over time, and the pods each MIG device order refused; drawn with
//! plotters and Debian's DejaVu Sans.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context as _;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::contender::Operator;
use super::packing::PackingBench;
use super::report::Row;
use super::upgrade::UpgradeBench;
use dra_driver::packing::Order;

const FONT_PACKAGE: &str = "fonts-dejavu-core";
const FONT_FILE: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The family name charts ask plotters for; the font is registered under it.
const FAMILY: &str = "sans-serif";

const WIDTH: u32 = 900;
const HEIGHT: u32 = 560;
const OURS: RGBColor = RGBColor(31, 119, 180);
const LIMIT: RGBColor = RGBColor(214, 39, 40);

/// The driver upgrade's chart.
const UPGRADE_FILE: &str = "driver-upgrade.png";
/// MIG on demand's packing chart.
const PACKING_FILE: &str = "mig-packing.png";

/// One line of a chart: a figure of one operator.
struct Series {
    label: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// A figure a chart draws per operator: its name and how to read it from a row.
type Figure = (&'static str, fn(&Row) -> f64);

/// What one chart shows: its file, title, y axis and figures.
struct Chart {
    file: &'static str,
    title: &'static str,
    y_label: &'static str,
    figures: &'static [Figure],
    /// Figures of an operator's own process (memory, requests), which the floor has not.
    of_the_process: bool,
}

const CHARTS: &[Chart] = &[
    Chart {
        file: "time-to-ready.png",
        title: "ClusterPolicy created → every operand ready",
        y_label: "seconds",
        figures: &[("ready", |row| row.ready_s)],
        of_the_process: false,
    },
    Chart {
        file: "patch-propagation.png",
        title: "kubectl patch of an operand version",
        y_label: "seconds",
        figures: &[
            ("to the DaemonSet", |row| row.patch_to_daemonset_s),
            ("to ready again", |row| row.patch_to_ready_s),
        ],
        of_the_process: false,
    },
    Chart {
        file: "rss.png",
        title: "Operator memory",
        y_label: "RSS, MiB",
        figures: &[
            ("steady", |row| row.steady_rss_mib),
            ("peak", |row| row.peak_rss_mib),
        ],
        of_the_process: true,
    },
    Chart {
        file: "requests-at-rest.png",
        title: "API requests at rest",
        y_label: "requests per minute",
        figures: &[
            ("all requests", |row| row.at_rest.total() as f64),
            ("writes (Leases apart)", |row| row.at_rest.writes() as f64),
        ],
        of_the_process: true,
    },
];

/// Draws every chart into `dir`; returns the files written.
pub fn draw_all(rows: &[Row], dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    load_font()?;
    CHARTS
        .iter()
        .map(|chart| {
            let path = dir.join(chart.file);
            draw(chart, &series(chart, rows), &path)?;
            Ok(path)
        })
        .collect()
}

/// Registers DejaVu Sans with plotters, once (installing Debian's package if the file is missing).
fn load_font() -> anyhow::Result<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            harness::apt::ensure(&[(FONT_PACKAGE, FONT_FILE)])
                .map_err(|error| format!("{error:#}"))?;
            let bytes =
                std::fs::read(FONT_FILE).map_err(|error| format!("{FONT_FILE}: {error}"))?;
            // plotters keeps registered fonts for the life of the process.
            plotters::style::register_font(
                FAMILY,
                FontStyle::Normal,
                Box::leak(bytes.into_boxed_slice()),
            )
            .map_err(|_| format!("{FONT_FILE} is not a font plotters can read"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
        .context("loading the charts' font")
}

/// One line per operator and figure, in node order; ours in blues, NVIDIA's in reds, the floor in greys.
fn series(chart: &Chart, rows: &[Row]) -> Vec<Series> {
    let mut lines = Vec::new();
    for (operator, colors) in [
        (Operator::Ours, [OURS, RGBColor(120, 180, 230)]),
        (
            Operator::Nvidia,
            [RGBColor(214, 39, 40), RGBColor(255, 152, 100)],
        ),
        (
            Operator::Floor,
            [RGBColor(90, 90, 90), RGBColor(170, 170, 170)],
        ),
    ] {
        let mut own: Vec<&Row> = rows.iter().filter(|row| row.operator == operator).collect();
        if own.is_empty() || (chart.of_the_process && !operator.runs_a_process()) {
            continue;
        }
        own.sort_by_key(|row| row.nodes);
        for ((figure, value), color) in chart.figures.iter().zip(colors) {
            let label = if chart.figures.len() == 1 {
                operator.label()
            } else {
                format!("{}: {figure}", operator.label())
            };
            lines.push(Series {
                label,
                color,
                points: own
                    .iter()
                    .map(|row| (f64::from(row.nodes), value(row)))
                    .collect(),
            });
        }
    }
    lines
}

/// The y axis a chart's values need: logarithmic where they are all above zero and span a decade or more (a
/// patch reaches its DaemonSet in milliseconds and its nodes in seconds: on a linear axis the first is a flat
/// line at zero), else linear from zero.
#[derive(Debug, Clone, Copy, PartialEq)]
enum YAxis {
    Linear { max: f64 },
    Log { min: f64, max: f64 },
}

fn y_axis(values: impl Iterator<Item = f64>) -> YAxis {
    let (min, max) = values.fold((f64::MAX, 0.0_f64), |(min, max), y| {
        (min.min(y), max.max(y))
    });
    if min > 0.0 && max / min >= 10.0 {
        YAxis::Log {
            min: min / 1.5,
            max: max * 1.5,
        }
    } else {
        YAxis::Linear {
            max: max.max(1e-3) * 1.15,
        }
    }
}

fn draw(chart: &Chart, series: &[Series], path: &Path) -> anyhow::Result<()> {
    let points = || series.iter().flat_map(|line| line.points.iter());
    let x_min = points().map(|(x, _)| *x).fold(f64::MAX, f64::min).min(10.0);
    let x_max = points()
        .map(|(x, _)| *x)
        .fold(1.0, f64::max)
        .max(x_min * 10.0);
    let x = (x_min * 0.8..x_max * 1.25).log_scale();
    match y_axis(points().map(|(_, y)| *y)) {
        YAxis::Linear { max } => draw_on(chart, series, path, x, 0.0..max, chart.y_label.into()),
        YAxis::Log { min, max } => draw_on(
            chart,
            series,
            path,
            x,
            (min..max).log_scale(),
            format!("{} (log scale)", chart.y_label),
        ),
    }
}

fn draw_on<X, Y>(
    chart: &Chart,
    series: &[Series],
    path: &Path,
    x: X,
    y: Y,
    y_desc: String,
) -> anyhow::Result<()>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut context = ChartBuilder::on(&root)
        .caption(chart.title, (FAMILY, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(plot_error)?;
    context
        .configure_mesh()
        .x_desc("GPU nodes (log scale)")
        .y_desc(y_desc)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{}", Readable(*y)))
        .draw()
        .map_err(plot_error)?;
    for line in series {
        let style = line.color.stroke_width(3);
        let color = line.color;
        context
            .draw_series(LineSeries::new(line.points.iter().copied(), style))
            .map_err(plot_error)?
            .label(line.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
        context
            .draw_series(
                line.points
                    .iter()
                    .map(|point| Circle::new(*point, 5, line.color.filled())),
            )
            .map_err(plot_error)?;
    }
    draw_legend(&mut context)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// An axis value with as many decimals as its size needs: 0.005, 0.05, 0.5, 5, 50, 500.
struct Readable(f64);

impl std::fmt::Display for Readable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let value = self.0;
        let decimals = if value == 0.0 || value.abs() >= 10.0 {
            0
        } else {
            // One significant digit below 10: 0.004 has three decimals, 2.5 one.
            (-value.abs().log10().floor()).max(1.0) as usize
        };
        write!(f, "{value:.decimals$}")
    }
}

/// The nodes in flight in each second of the driver upgrade (the most during that second), and the limit; returns
/// the file written to `dir`.
pub fn draw_upgrade(upgrade: &UpgradeBench, dir: &Path) -> anyhow::Result<PathBuf> {
    load_font()?;
    let path = dir.join(UPGRADE_FILE);
    draw_in_flight(upgrade, &path)?;
    Ok(path)
}

fn draw_in_flight(upgrade: &UpgradeBench, path: &Path) -> anyhow::Result<()> {
    let seconds = upgrade.in_flight.len().max(1) as f64;
    let y_max = f64::from(upgrade.max_in_flight.max(upgrade.max_parallel)) * 1.2;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let title = format!(
        "Driver upgrade of {} nodes, maxParallelUpgrades {}",
        upgrade.nodes, upgrade.max_parallel
    );
    let mut context = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..seconds, 0.0..y_max)
        .map_err(plot_error)?;
    context
        .configure_mesh()
        .x_desc("seconds since the patch of driver.version")
        .y_desc("nodes in flight")
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(plot_error)?;
    let limit = f64::from(upgrade.max_parallel);
    for (label, color, points) in [
        (
            "nodes in flight (most per second)".to_owned(),
            OURS,
            upgrade
                .in_flight
                .iter()
                .enumerate()
                .map(|(second, nodes)| (second as f64, f64::from(*nodes)))
                .collect::<Vec<_>>(),
        ),
        (
            format!("maxParallelUpgrades {}", upgrade.max_parallel),
            LIMIT,
            vec![(0.0, limit), (seconds, limit)],
        ),
    ] {
        context
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
    }
    draw_legend(&mut context)?;
    root.present().map_err(plot_error)
}

/// The pods each device order refused, and of them those refused for fragmentation: a bar at the median of the
/// seeds, a whisker from the least to the most; returns the file written to `dir`.
pub fn draw_packing(packing: &PackingBench, dir: &Path) -> anyhow::Result<PathBuf> {
    load_font()?;
    let path = dir.join(PACKING_FILE);
    draw_refusals(packing, &path)?;
    Ok(path)
}

/// One bar of the packing chart: its series, its order's position and its spread.
struct Bar {
    label: String,
    color: RGBColor,
    x: f64,
    median: f64,
    min: f64,
    max: f64,
}

fn packing_bars(packing: &PackingBench) -> Vec<Bar> {
    let mut bars = Vec::new();
    for (position, order) in Order::ALL.into_iter().enumerate() {
        let [refused, fragmented] = match order {
            Order::Ours => [OURS, RGBColor(120, 180, 230)],
            Order::Nvidia => [RGBColor(214, 39, 40), RGBColor(255, 152, 100)],
        };
        let x = position as f64;
        let name = match order {
            Order::Ours => "ours",
            Order::Nvidia => "NVIDIA's",
        };
        for (label, color, offset, figure) in [
            (
                "refused",
                refused,
                -0.2,
                (|figures| f64::from(figures.refused)) as fn(&super::packing::Figures) -> f64,
            ),
            ("of which for fragmentation", fragmented, 0.2, |figures| {
                f64::from(figures.refused_fragmented)
            }),
        ] {
            let spread = packing.spread(order, figure);
            bars.push(Bar {
                label: format!("{name}: {label}"),
                color,
                x: x + offset,
                median: spread.median,
                min: spread.min,
                max: spread.max,
            });
        }
    }
    bars
}

fn draw_refusals(packing: &PackingBench, path: &Path) -> anyhow::Result<()> {
    let bars = packing_bars(packing);
    // Room above the bars for the legend.
    let y_max = bars.iter().map(|bar| bar.max).fold(1.0, f64::max) * 1.6;
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let title = format!(
        "MIG on demand: pods refused of {} ({} {}, {} seeds)",
        packing.arrivals,
        packing.gpus,
        packing.model,
        packing.runs.len()
    );
    let mut context = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 22))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.6..1.6, 0.0..y_max)
        .map_err(plot_error)?;
    context
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(12)
        .x_desc("device order (bar: median; whisker: least to most)")
        .y_desc("pods")
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .x_label_formatter(&|x: &f64| {
            let near = |position: f64| (*x - position).abs() < 1e-6;
            if near(0.0) {
                "ours".to_owned()
            } else if near(1.0) {
                "NVIDIA's".to_owned()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()
        .map_err(plot_error)?;
    for bar in &bars {
        let color = bar.color;
        context
            .draw_series([Rectangle::new(
                [(bar.x - 0.17, 0.0), (bar.x + 0.17, bar.median)],
                color.filled(),
            )])
            .map_err(plot_error)?
            .label(bar.label.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 24, y + 6)], color.filled()));
        context
            .draw_series([
                PathElement::new(
                    vec![(bar.x, bar.min), (bar.x, bar.max)],
                    BLACK.stroke_width(2),
                ),
                PathElement::new(
                    vec![(bar.x - 0.05, bar.min), (bar.x + 0.05, bar.min)],
                    BLACK.stroke_width(2),
                ),
                PathElement::new(
                    vec![(bar.x - 0.05, bar.max), (bar.x + 0.05, bar.max)],
                    BLACK.stroke_width(2),
                ),
            ])
            .map_err(plot_error)?;
    }
    draw_legend(&mut context)?;
    root.present().map_err(plot_error)
}

fn draw_legend<'a, X, Y>(
    context: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
) -> anyhow::Result<()>
where
    X: Ranged,
    Y: Ranged,
{
    context
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a chart failed: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::report::Reconciles;
    use harness::cluster::audit::Requests;

    fn row(operator: Operator, nodes: u32, ready_s: f64) -> Row {
        Row {
            operator,
            nodes,
            run: 1,
            daemonsets_s: 0.5,
            labelled_s: 0.6,
            available_s: ready_s,
            ready_s,
            patch_to_daemonset_s: 0.4,
            patch_to_ready_s: 2.0,
            peak_rss_mib: 40.0,
            steady_rss_mib: 20.0,
            cpu_s: 1.0,
            cpu_rest_s: 0.1,
            at_rest: Requests::default(),
            rollout: Requests::default(),
            reconciles: Reconciles::default(),
            daemonsets: Vec::new(),
            rolled_out_s: std::collections::BTreeMap::new(),
        }
    }

    #[test]
    fn one_line_per_operator_and_figure_in_node_order() {
        let rows = [
            row(Operator::Nvidia, 100, 9.0),
            row(Operator::Ours, 100, 3.0),
            row(Operator::Ours, 10, 1.0),
            row(Operator::Nvidia, 10, 4.0),
        ];
        let ready = series(&CHARTS[0], &rows);
        assert_eq!(ready.len(), 2);
        assert_eq!(ready[0].label, Operator::Ours.label());
        assert_eq!(ready[0].points, vec![(10.0, 1.0), (100.0, 3.0)]);
        assert_eq!(ready[1].points, vec![(10.0, 4.0), (100.0, 9.0)]);
        let patch = series(&CHARTS[1], &rows);
        assert_eq!(patch.len(), 4);
        assert!(patch[3].label.ends_with(": to ready again"));
        assert_eq!(series(&CHARTS[0], &rows[1..3]).len(), 1, "ours alone");
        let with_floor = [row(Operator::Ours, 10, 1.0), row(Operator::Floor, 10, 0.5)];
        let ready = series(&CHARTS[0], &with_floor);
        assert_eq!(ready[1].label, Operator::Floor.label());
        let memory = series(&CHARTS[2], &with_floor);
        assert_eq!(
            memory.len(),
            2,
            "the floor has no memory of its own to draw"
        );
        assert!(memory.iter().all(|line| !line.label.contains("floor")));
    }

    #[test]
    fn draws_the_upgrade_chart_as_a_png() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-upgrade-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let upgrade = UpgradeBench {
            commit: "abc1234".into(),
            date: "2026-11-27T10:00:00Z".into(),
            nodes: 100,
            max_parallel: 50,
            total_s: 3.5,
            max_in_flight: 50,
            in_flight: vec![0, 50, 50, 12],
            requests: Requests::default(),
        };
        let file = draw_upgrade(&upgrade, &dir).unwrap();
        assert!(std::fs::read(&file).unwrap().starts_with(b"\x89PNG"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_packing_chart_has_a_bar_and_whisker_per_order_and_figure() {
        let packing = crate::bench::packing::tests::bench(&[(190, 200), (180, 170), (210, 230)]);
        let bars = packing_bars(&packing);
        let labels: Vec<&str> = bars.iter().map(|bar| bar.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "ours: refused",
                "ours: of which for fragmentation",
                "NVIDIA's: refused",
                "NVIDIA's: of which for fragmentation"
            ]
        );
        assert_eq!(
            (bars[0].median, bars[0].min, bars[0].max),
            (190.0, 180.0, 210.0)
        );
        assert_eq!(
            (bars[3].median, bars[3].min, bars[3].max),
            (66.0, 56.0, 76.0)
        );
        assert!(bars.windows(2).all(|pair| pair[0].x < pair[1].x));
        let dir = std::env::temp_dir().join(format!("xtask-plot-packing-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = draw_packing(&packing, &dir).unwrap();
        assert!(std::fs::read(&file).unwrap().starts_with(b"\x89PNG"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn values_over_a_decade_get_a_log_axis_and_zeros_a_linear_one() {
        assert!(matches!(
            y_axis([0.004, 2.7, 175.0].into_iter()),
            YAxis::Log { .. }
        ));
        assert!(matches!(
            y_axis([3.0, 9.0].into_iter()),
            YAxis::Linear { .. }
        ));
        assert!(
            matches!(y_axis([0.0, 20.0].into_iter()), YAxis::Linear { .. }),
            "zero writes at rest have no place on a log axis"
        );
        assert_eq!(Readable(0.004).to_string(), "0.004");
        assert_eq!(Readable(2.5).to_string(), "2.5");
        assert_eq!(Readable(175.0).to_string(), "175");
    }

    #[test]
    fn draws_every_chart_as_a_png() {
        let dir = std::env::temp_dir().join(format!("xtask-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let rows = [row(Operator::Ours, 10, 1.0), row(Operator::Nvidia, 10, 4.0)];
        let files = draw_all(&rows, &dir).unwrap();
        assert_eq!(files.len(), CHARTS.len());
        for file in files {
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                bytes.starts_with(b"\x89PNG"),
                "{} is not a PNG",
                file.display()
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
