//! `bench.png`: time to ready (left, blue; patch to ready in red) and operator RSS (right, green) against the node
//! count. Drawn without text, so that no system fonts are needed: the x axis runs from 0 to 1.1 × the largest node
//! count, each y axis from 0 to 1.2 × its largest value; `bench.md` has the numbers.

use std::path::Path;

use plotters::prelude::*;

use super::report::Row;

pub fn draw(rows: &[Row], path: &Path) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, (900, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(450);
    let points = |value: fn(&Row) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .map(|row| (f64::from(row.nodes), value(row)))
            .collect()
    };
    panel(
        &left,
        &[
            (points(|row| row.ready_s), BLUE),
            (points(|row| row.patch_to_ready_s), RED),
        ],
    )?;
    panel(&right, &[(points(|row| row.rss_mib), GREEN)])?;
    root.present().map_err(plot_error)?;
    Ok(())
}

fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    series: &[(Vec<(f64, f64)>, RGBColor)],
) -> anyhow::Result<()> {
    let all = series.iter().flat_map(|(points, _)| points.iter());
    let x_max = all.clone().map(|(x, _)| *x).fold(1.0, f64::max) * 1.1;
    let y_max = all.map(|(_, y)| *y).fold(1e-3, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(area)
        .margin(30)
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
    Ok(())
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
        let dir = std::env::temp_dir().join(format!("xtask-bench-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bench.png");
        draw(&[row(10, 1.0, 20.0), row(100, 3.0, 30.0)], &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(b"\x89PNG"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
