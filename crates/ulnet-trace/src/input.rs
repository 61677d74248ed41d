//! Samples for `trace tail`: a column of a trace file, of a CSV or whitespace-separated
//! table, or a file of one number per line.

use crate::load::{self, LoadError};
use crate::tail::Arrivals;
use std::path::Path;
use ulnet_core::trace::format::FILE_MAGIC;
use ulnet_core::trace::Direction;

/// Columns a trace file offers.
pub const TRACE_COLUMNS: [&str; 5] = ["size", "interarrival_ns", "handler_ns", "buffers", "rtt_ns"];

/// Why a sample could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// The file could not be read.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
    /// A trace file that does not load.
    #[error(transparent)]
    Trace(#[from] LoadError),
    /// No such column.
    #[error("{file}: no column {column:?} (columns: {available})")]
    NoColumn {
        /// The file.
        file: String,
        /// What was asked for.
        column: String,
        /// What there is.
        available: String,
    },
    /// A value that is not a number.
    #[error("{file}:{line}: {value:?} is not a number")]
    NotANumber {
        /// The file.
        file: String,
        /// Line number (from 1).
        line: usize,
        /// The text.
        value: String,
    },
    /// Nothing to analyse.
    #[error("{0}: no values")]
    Empty(String),
}

/// A sample and what it came from.
#[derive(Debug)]
pub struct Sample {
    /// The column read.
    pub column: String,
    /// Its values, in file order.
    pub values: Vec<f64>,
    /// Arrivals for the time-scale analysis.
    pub arrivals: Arrivals,
}

/// Reads column `column` (a name, or a 1-based number; default: the first numeric column,
/// or `size` for traces) of `path`.
pub fn read_sample(path: &Path, column: Option<&str>) -> Result<Sample, InputError> {
    read_sample_with(path, column, false)
}

/// [`read_sample`]; with `partial`, a trace file cut short contributes its intact blocks
/// (see [`load::load_with`]).
pub fn read_sample_with(path: &Path, column: Option<&str>, partial: bool) -> Result<Sample, InputError> {
    let name = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| InputError::Io(name.clone(), e))?;
    if bytes.starts_with(&FILE_MAGIC) {
        return trace_sample(path, column, partial);
    }
    let text = String::from_utf8_lossy(&bytes);
    let sample = text_sample(&name, &text, column)?;
    if sample.values.is_empty() {
        return Err(InputError::Empty(name));
    }
    Ok(sample)
}

fn trace_sample(path: &Path, column: Option<&str>, partial: bool) -> Result<Sample, InputError> {
    let trace = load::load_with(&[path], partial)?;
    let column = column.unwrap_or("size").to_ascii_lowercase();
    let sends: Vec<_> = crate::analyze::counted(&trace).into_iter().copied().collect();
    let times: Vec<f64> = sends.iter().map(|m| m.t_ns as f64).collect();
    let values: Vec<f64> = match column.as_str() {
        "size" => sends.iter().map(|m| m.size as f64).collect(),
        "buffers" => sends.iter().filter(|m| m.buffers > 0).map(|m| f64::from(m.buffers)).collect(),
        "interarrival_ns" => times.windows(2).map(|w| w[1] - w[0]).collect(),
        "handler_ns" => trace
            .messages
            .iter()
            .filter(|m| m.direction == Direction::Receive)
            .filter_map(|m| Some((m.handler_end? - m.handler_start?) as f64))
            .collect(),
        "rtt_ns" => rtts(&trace),
        _ => {
            return Err(InputError::NoColumn {
                file: path.display().to_string(),
                column,
                available: TRACE_COLUMNS.join(", "),
            })
        }
    };
    if values.is_empty() {
        return Err(InputError::Empty(format!("{} [{column}]", path.display())));
    }
    Ok(Sample { column, values, arrivals: Arrivals::Times(times) })
}

/// Round trips at requesters: request sent to its response received, same file.
fn rtts(trace: &load::Trace) -> Vec<f64> {
    use std::collections::HashMap;
    use ulnet_core::trace::MessageKind;
    let mut sent: HashMap<(usize, u32, u64), u64> = HashMap::new();
    let mut out = Vec::new();
    for m in &trace.messages {
        match (m.kind, m.direction, m.request_id) {
            (_, _, 0) => {}
            (MessageKind::Request, Direction::Send, id) => {
                sent.insert((m.file, m.dst, id), m.t_ns);
            }
            (MessageKind::Response, Direction::Receive, id) => {
                if let Some(t) = sent.remove(&(m.file, m.src, id)) {
                    out.push((m.t_ns - t) as f64);
                }
            }
            _ => {}
        }
    }
    out
}

fn split(line: &str, csv: bool) -> Vec<&str> {
    if csv {
        line.split(',').map(str::trim).collect()
    } else {
        line.split_whitespace().collect()
    }
}

/// Reads a column of a text table (CSV when the first data line has a comma, else
/// whitespace-separated; `#` starts a comment line; a first line that is not all numbers
/// names the columns). The values are read as gaps between arrivals for the time-scale
/// analysis.
pub fn text_sample(name: &str, text: &str, column: Option<&str>) -> Result<Sample, InputError> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let Some(&(_, first)) = lines.first() else { return Err(InputError::Empty(name.to_string())) };
    let csv = first.contains(',');
    let first_fields = split(first, csv);
    let has_header = first_fields.iter().any(|f| f.parse::<f64>().is_err());
    let headers: Vec<String> = if has_header {
        first_fields.iter().map(|s| s.trim_matches('"').to_string()).collect()
    } else {
        (1..=first_fields.len()).map(|i| format!("column {i}")).collect()
    };
    let data = if has_header { &lines[1..] } else { &lines[..] };
    let index = match column {
        Some(c) => headers
            .iter()
            .position(|h| h.eq_ignore_ascii_case(c))
            .or_else(|| c.parse::<usize>().ok().filter(|i| (1..=headers.len()).contains(i)).map(|i| i - 1))
            .ok_or_else(|| InputError::NoColumn {
                file: name.to_string(),
                column: c.to_string(),
                available: headers.join(", "),
            })?,
        None => {
            // The first column whose first data value is a number.
            let row = data.first().map(|(_, l)| split(l, csv)).unwrap_or_default();
            row.iter().position(|f| f.parse::<f64>().is_ok()).unwrap_or(0)
        }
    };
    let mut values = Vec::with_capacity(data.len());
    for &(line, l) in data {
        let fields = split(l, csv);
        let Some(raw) = fields.get(index) else {
            return Err(InputError::NotANumber { file: name.to_string(), line, value: String::new() });
        };
        let v = raw.trim_matches('"').parse::<f64>().map_err(|_| InputError::NotANumber {
            file: name.to_string(),
            line,
            value: raw.to_string(),
        })?;
        values.push(v);
    }
    Ok(Sample { column: headers[index].clone(), arrivals: Arrivals::Gaps(values.clone()), values })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_csv_by_name_and_plain_numbers() {
        let s = text_sample("t", "a,b\n1,10\n2,20\n", Some("b")).unwrap();
        assert_eq!((s.column.as_str(), s.values), ("b", vec![10.0, 20.0]));
        let s = text_sample("t", "# comment\n3\n4.5\n\n", None).unwrap();
        assert_eq!(s.values, vec![3.0, 4.5]);
        let s = text_sample("t", "1 2 3\n4 5 6\n", Some("3")).unwrap();
        assert_eq!(s.values, vec![3.0, 6.0]);
        let s = text_sample("t", "name size\nx 7\n", None).unwrap();
        assert_eq!((s.column.as_str(), s.values), ("size", vec![7.0]));
    }

    #[test]
    fn names_the_bad_line() {
        let e = text_sample("f", "1\n2\nthree\n", None).unwrap_err().to_string();
        assert_eq!(e, "f:3: \"three\" is not a number");
        let e = text_sample("f", "a,b\n1,2\n", Some("c")).unwrap_err().to_string();
        assert!(e.contains("no column \"c\""), "{e}");
    }
}
