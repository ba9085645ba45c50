//! The report's PNG charts: one figure against the node count (log scale) per chart, one line per operator and
//! figure, drawn with plotters and Debian's DejaVu Sans.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context as _;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::contender::Operator;
use super::report::Row;

const FONT_PACKAGE: &str = "fonts-dejavu-core";
const FONT_FILE: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The family name charts ask plotters for; the font is registered under it.
const FAMILY: &str = "sans-serif";

const WIDTH: u32 = 900;
const HEIGHT: u32 = 560;

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
}

const CHARTS: &[Chart] = &[
    Chart {
        file: "time-to-ready.png",
        title: "ClusterPolicy created → every operand ready",
        y_label: "seconds",
        figures: &[("ready", |row| row.ready_s)],
    },
    Chart {
        file: "patch-propagation.png",
        title: "kubectl patch of an operand version",
        y_label: "seconds",
        figures: &[
            ("to the DaemonSet", |row| row.patch_to_daemonset_s),
            ("to ready again", |row| row.patch_to_ready_s),
        ],
    },
    Chart {
        file: "rss.png",
        title: "Operator memory",
        y_label: "RSS, MiB",
        figures: &[
            ("steady", |row| row.steady_rss_mib),
            ("peak", |row| row.peak_rss_mib),
        ],
    },
    Chart {
        file: "requests-at-rest.png",
        title: "API requests at rest",
        y_label: "requests per minute",
        figures: &[
            ("all requests", |row| row.at_rest.total() as f64),
            ("writes (Leases apart)", |row| row.at_rest.writes() as f64),
        ],
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
            crate::apt::ensure(&[(FONT_PACKAGE, FONT_FILE)])
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

/// One line per operator and figure, in node order; ours in blues, NVIDIA's in reds.
fn series(chart: &Chart, rows: &[Row]) -> Vec<Series> {
    let mut lines = Vec::new();
    for (operator, colors) in [
        (
            Operator::Ours,
            [RGBColor(31, 119, 180), RGBColor(120, 180, 230)],
        ),
        (
            Operator::Nvidia,
            [RGBColor(214, 39, 40), RGBColor(255, 152, 100)],
        ),
    ] {
        let mut own: Vec<&Row> = rows.iter().filter(|row| row.operator == operator).collect();
        if own.is_empty() {
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

fn draw(chart: &Chart, series: &[Series], path: &Path) -> anyhow::Result<()> {
    let points = || series.iter().flat_map(|line| line.points.iter());
    let x_min = points().map(|(x, _)| *x).fold(f64::MAX, f64::min).min(10.0);
    let x_max = points()
        .map(|(x, _)| *x)
        .fold(1.0, f64::max)
        .max(x_min * 10.0);
    let y_max = points().map(|(_, y)| *y).fold(0.0, f64::max).max(1e-3) * 1.15;

    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut context = ChartBuilder::on(&root)
        .caption(chart.title, (FAMILY, 24))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d((x_min * 0.8..x_max * 1.25).log_scale(), 0.0..y_max)
        .map_err(plot_error)?;
    context
        .configure_mesh()
        .x_desc("GPU nodes (log scale)")
        .y_desc(chart.y_label)
        .label_style((FAMILY, 15))
        .axis_desc_style((FAMILY, 17))
        .x_label_formatter(&|x| format!("{x:.0}"))
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
    context
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font((FAMILY, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing a chart failed: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::audit::Requests;
    use crate::bench::report::Reconciles;

    fn row(operator: Operator, nodes: u32, ready_s: f64) -> Row {
        Row {
            operator,
            nodes,
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
