//! The plan as two tables: where each request landed, and what each device has left.

use std::fmt;

use crate::dra::{CAPACITY_CORES, CAPACITY_MEMORY};

use super::{MIB, Plan};

/// `3000 MiB` for whole MiB, bytes otherwise.
pub(super) fn format_bytes(bytes: u64) -> String {
    if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

/// An amount of a capacity in its own units: memory in MiB, cores as cores.
pub(super) fn format_amount(key: &str, amount: u64) -> String {
    match key {
        CAPACITY_MEMORY => format_bytes(amount),
        CAPACITY_CORES => format!("{amount} cores"),
        _ => format!("{amount} {key}"),
    }
}

impl fmt::Display for Plan {
    /// Two tables: each request's devices (memory in MiB, cores; `-` for a device without the capacity), or why
    /// it has none; then each device's memory and cores, used/free.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut placements = Table::new([
            "REQUEST",
            "NODE",
            "DEVICE",
            "PRODUCT",
            "MEMORY MiB",
            "CORES",
        ]);
        for placement in &self.placements {
            for note in &placement.notes {
                placements.note(placement.request.clone(), format!("note: {note}"));
            }
            match &placement.outcome {
                Ok(landed) => {
                    for device in landed {
                        placements.row(vec![
                            placement.request.clone(),
                            device.node.clone(),
                            device.device.clone(),
                            device.product.clone().unwrap_or_else(|| "-".to_owned()),
                            (device.memory_bytes / MIB).to_string(),
                            device
                                .cores
                                .map_or_else(|| "-".to_owned(), |c| c.to_string()),
                        ]);
                    }
                }
                Err(why) => placements.note(placement.request.clone(), format!("unplaced: {why}")),
            }
        }
        placements.write(f)?;
        writeln!(f)?;
        let mut devices = Table::new([
            "NODE",
            "DEVICE",
            "PRODUCT",
            "MEMORY USED/FREE MiB",
            "CORES USED/FREE",
        ]);
        for device in &self.remaining {
            devices.row(vec![
                device.node.clone(),
                device.device.clone(),
                device.product.clone().unwrap_or_else(|| "-".to_owned()),
                device.memory.map_or_else(
                    || "-".to_owned(),
                    |m| format!("{}/{}", m.used / MIB, m.free() / MIB),
                ),
                device
                    .cores
                    .map_or_else(|| "-".to_owned(), |c| format!("{}/{}", c.used, c.free())),
            ]);
        }
        devices.write(f)
    }
}

/// Left-aligned columns two spaces apart; a note row fills the first column and runs on past the others.
struct Table {
    header: Vec<String>,
    rows: Vec<Row>,
}

enum Row {
    Cells(Vec<String>),
    Note(String, String),
}

impl Table {
    fn new<const N: usize>(header: [&str; N]) -> Self {
        Self {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(Row::Cells(cells));
    }

    fn note(&mut self, first: String, text: String) {
        self.rows.push(Row::Note(first, text));
    }

    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            match row {
                Row::Cells(cells) => {
                    for (width, cell) in widths.iter_mut().zip(cells) {
                        *width = (*width).max(cell.chars().count());
                    }
                }
                Row::Note(first, _) => widths[0] = widths[0].max(first.chars().count()),
            }
        }
        let line = |f: &mut fmt::Formatter<'_>, cells: &[String]| {
            let mut text = String::new();
            for (cell, width) in cells.iter().zip(&widths) {
                text.push_str(&format!("{cell:<width$}  "));
            }
            writeln!(f, "{}", text.trim_end())
        };
        line(f, &self.header)?;
        for row in &self.rows {
            match row {
                Row::Cells(cells) => line(f, cells)?,
                Row::Note(first, text) => line(f, &[first.clone(), text.clone()])?,
            }
        }
        Ok(())
    }
}
