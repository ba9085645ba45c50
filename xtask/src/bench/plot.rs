//! `bench.png`: time to ready (left; blue: operator start to ready, red: patch to ready again) and operator RSS
//! (right, green) against the node count. Text is drawn with a built-in 3×5 pixel font, so that no system fonts are
//! needed.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Row;

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 460;

pub fn draw(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(WIDTH / 2);
    let points = |value: fn(&Row) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .map(|row| (f64::from(row.nodes), value(row)))
            .collect()
    };
    panel(
        &root,
        &left,
        0,
        "SECONDS TO READY (BLUE) PATCH TO READY (RED)",
        &[
            (points(|row| row.ready_s), BLUE),
            (points(|row| row.patch_to_ready_s), RED),
        ],
    )?;
    panel(
        &root,
        &right,
        WIDTH as i32 / 2,
        "OPERATOR RSS MIB",
        &[(points(|row| row.rss_mib), GREEN)],
    )?;
    root.present().map_err(plot_error)?;
    Ok(())
}

fn panel(
    root: &Area<'_>,
    area: &Area<'_>,
    x_offset: i32,
    title: &str,
    series: &[(Vec<(f64, f64)>, RGBColor)],
) -> anyhow::Result<()> {
    let all = series.iter().flat_map(|(points, _)| points.iter());
    let x_max = all.clone().map(|(x, _)| *x).fold(1.0, f64::max) * 1.1;
    let y_max = all.map(|(_, y)| *y).fold(1e-3, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(area)
        .margin_top(50)
        .margin_bottom(50)
        .margin_left(70)
        .margin_right(20)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)
        .map_err(plot_error)?;
    let axes = PathElement::new(vec![(0.0, y_max), (0.0, 0.0), (x_max, 0.0)], BLACK);
    chart
        .draw_series(std::iter::once(axes))
        .map_err(plot_error)?;
    for (points, color) in series {
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(plot_error)?;
        chart
            .draw_series(
                points
                    .iter()
                    .map(|point| Circle::new(*point, 5, color.filled())),
            )
            .map_err(plot_error)?;
    }
    // Labels, in the backend's pixel coordinates.
    scaled_text(root, (x_offset + 20, 15), title, 2)?;
    text(
        root,
        (x_offset + WIDTH as i32 / 4 - 15, HEIGHT as i32 - 22),
        "NODES",
    )?;
    let nodes = series
        .first()
        .map(|(points, _)| points.as_slice())
        .unwrap_or_default();
    for (x, _) in nodes {
        let (px, py) = chart.backend_coord(&(*x, 0.0));
        let label = format!("{x}");
        text(root, (px - 6 * label.len() as i32, py + 8), &label)?;
    }
    for step in 0..=4 {
        let y = y_max * f64::from(step) / 4.0;
        let (px, py) = chart.backend_coord(&(0.0, y));
        let label = if y_max >= 10.0 {
            format!("{y:.0}")
        } else {
            format!("{y:.1}")
        };
        text(root, (px - 12 * label.len() as i32 - 6, py - 7), &label)?;
        root.draw(&PathElement::new(vec![(px - 4, py), (px, py)], BLACK))
            .map_err(plot_error)?;
    }
    Ok(())
}

/// Draws `label` (upper case, digits, `.()`) with its top left corner at `at`, 3 pixels to a font pixel.
fn text(root: &Area<'_>, at: (i32, i32), label: &str) -> anyhow::Result<()> {
    scaled_text(root, at, label, 3)
}

/// Draws `label` with `scale` pixels to a font pixel.
fn scaled_text(root: &Area<'_>, at: (i32, i32), label: &str, scale: i32) -> anyhow::Result<()> {
    for (index, character) in label.chars().enumerate() {
        let Some(rows) = glyph(character) else {
            continue;
        };
        let left = at.0 + index as i32 * 4 * scale;
        for (row, bits) in rows.iter().enumerate() {
            for (column, bit) in bits.bytes().enumerate() {
                if bit == b'1' {
                    let x = left + column as i32 * scale;
                    let y = at.1 + row as i32 * scale;
                    root.draw(&Rectangle::new(
                        [(x, y), (x + scale, y + scale)],
                        BLACK.filled(),
                    ))
                    .map_err(plot_error)?;
                }
            }
        }
    }
    Ok(())
}

/// A 3×5 pixel glyph, top row first; None for a space or a character the font lacks.
fn glyph(character: char) -> Option<[&'static str; 5]> {
    Some(match character {
        '0' => ["111", "101", "101", "101", "111"],
        '1' => ["010", "110", "010", "010", "111"],
        '2' => ["111", "001", "111", "100", "111"],
        '3' => ["111", "001", "111", "001", "111"],
        '4' => ["101", "101", "111", "001", "001"],
        '5' => ["111", "100", "111", "001", "111"],
        '6' => ["111", "100", "111", "101", "111"],
        '7' => ["111", "001", "001", "001", "001"],
        '8' => ["111", "101", "111", "101", "111"],
        '9' => ["111", "101", "111", "001", "111"],
        '.' => ["000", "000", "000", "000", "010"],
        '(' => ["001", "010", "010", "010", "001"],
        ')' => ["100", "010", "010", "010", "100"],
        'A' => ["010", "101", "111", "101", "101"],
        'B' => ["110", "101", "110", "101", "110"],
        'C' => ["011", "100", "100", "100", "011"],
        'D' => ["110", "101", "101", "101", "110"],
        'E' => ["111", "100", "110", "100", "111"],
        'G' => ["011", "100", "101", "101", "011"],
        'H' => ["101", "101", "111", "101", "101"],
        'I' => ["111", "010", "010", "010", "111"],
        'L' => ["100", "100", "100", "100", "111"],
        'M' => ["101", "111", "111", "101", "101"],
        'N' => ["110", "101", "101", "101", "101"],
        'O' => ["010", "101", "101", "101", "010"],
        'P' => ["110", "101", "110", "100", "100"],
        'R' => ["110", "101", "110", "101", "101"],
        'S' => ["011", "100", "010", "001", "110"],
        'T' => ["111", "010", "010", "010", "010"],
        'U' => ["101", "101", "101", "101", "111"],
        'W' => ["101", "101", "111", "111", "101"],
        'Y' => ["101", "101", "010", "010", "010"],
        _ => return None,
    })
}

fn plot_error(error: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("cannot draw the plot: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png() {
        let row = |nodes, ready_s, rss_mib| Row {
            nodes,
            ready_s,
            patch_to_daemonset_s: 0.5,
            patch_to_ready_s: 0.7,
            rss_mib,
            cpu_s: 1.0,
            cpu_rest_s: 0.0,
            writes_at_rest: 0,
            lease_writes_at_rest: 12,
        };
        let dir = std::env::var_os("BENCH_PLOT_TEST_DIR").map_or_else(
            || std::env::temp_dir().join(format!("xtask-bench-plot-{}", std::process::id())),
            std::path::PathBuf::from,
        );
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bench.png");
        draw(&[row(10, 1.0, 20.0), row(100, 3.0, 30.0)], &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"));
        if std::env::var_os("BENCH_PLOT_TEST_DIR").is_none() {
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    #[test]
    fn the_font_has_every_character_of_the_labels() {
        for label in [
            "SECONDS TO READY (BLUE) PATCH TO READY (RED)",
            "OPERATOR RSS MIB",
            "NODES",
            "0123456789.",
        ] {
            for character in label.chars().filter(|c| *c != ' ') {
                assert!(glyph(character).is_some(), "{character:?}");
            }
        }
    }
}
