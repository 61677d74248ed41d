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
    /// A trace whose messages are too many to sample one by one.
    #[error(
        "{file}: the trace stands for {messages} messages; `trace tail` samples at most {SAMPLE_VALUES_MAX} \
         (`trace analyze` has no such limit)"
    )]
    TooManyValues {
        /// The file.
        file: String,
        /// Messages it would sample (each message of a run is a value).
        messages: u64,
    },
}

/// Most messages of a trace that `trace tail` takes one by one: 2^27, 1 GiB of arrival
/// times and as much again for a column. A run record stands for up to 2^32 - 1 messages,
/// so a small file could otherwise ask for more memory than any machine has.
pub const SAMPLE_VALUES_MAX: u64 = 1 << 27;

/// A sample and what it came from.
#[derive(Debug)]
pub struct Sample {
    /// The column read.
    pub column: String,
    /// Its values, in file order (a trace's: by record, a run's messages together).
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
    sample_of_trace(&trace, &path.display().to_string(), column)
}

/// Column `column` (default `size`) of a loaded trace, named `name` in errors: one value
/// per message, a run's messages each with its own time (see [`load::Trace::message_t_ns`]).
pub fn sample_of_trace(trace: &load::Trace, name: &str, column: Option<&str>) -> Result<Sample, InputError> {
    let column = column.unwrap_or("size").to_ascii_lowercase();
    let sends = crate::analyze::counted(trace);
    let within_limit = |messages: u64| match messages {
        0..=SAMPLE_VALUES_MAX => Ok(()),
        _ => Err(InputError::TooManyValues { file: name.to_string(), messages }),
    };
    let messages = sends.iter().map(|m| u64::from(m.count)).sum();
    within_limit(messages)?;
    let mut times = Vec::with_capacity(messages as usize);
    times.extend(sends.iter().flat_map(|m| (0..u64::from(m.count)).map(|i| trace.message_t_ns(m, i) as f64)));
    // Runs overlap other records: their messages are in time order only once sorted.
    times.sort_by(f64::total_cmp);
    let values: Vec<f64> = match column.as_str() {
        "size" => per_message(sends.iter().map(|m| (m.size as f64, m.count))),
        "buffers" => per_message(sends.iter().filter(|m| m.buffers > 0).map(|m| (f64::from(m.buffers), m.count))),
        "interarrival_ns" => times.windows(2).map(|w| w[1] - w[0]).collect(),
        "handler_ns" => {
            let handled: Vec<(f64, u32)> = trace
                .messages
                .iter()
                .filter(|m| m.direction == Direction::Receive)
                .filter_map(|m| Some((m.handler_end.get()?.saturating_sub(m.handler_start.get()?) as f64, m.count)))
                .collect();
            within_limit(handled.iter().map(|h| u64::from(h.1)).sum())?;
            per_message(handled.into_iter())
        }
        "rtt_ns" => rtts(trace),
        _ => return Err(InputError::NoColumn { file: name.to_string(), column, available: TRACE_COLUMNS.join(", ") }),
    };
    if values.is_empty() {
        return Err(InputError::Empty(format!("{name} [{column}]")));
    }
    Ok(Sample { column, values, arrivals: Arrivals::Times(times) })
}

/// The values of records given as (value, messages it stands for), one per message.
fn per_message(records: impl Iterator<Item = (f64, u32)>) -> Vec<f64> {
    records.flat_map(|(value, count)| std::iter::repeat_n(value, count as usize)).collect()
}

/// Round trips at requesters: request sent to its response received, same file.
fn rtts(trace: &load::Trace) -> Vec<f64> {
    use std::collections::HashMap;
    use ulnet_core::trace::MessageKind;
    let mut sent: HashMap<(u32, u32, u64), u64> = HashMap::new();
    let mut out = Vec::new();
    for m in &trace.messages {
        match (m.kind, m.direction, m.request_id) {
            // A run is not a call (the decoder refuses runs with a request id).
            (_, _, 0) => {}
            _ if m.count > 1 => {}
            (MessageKind::Request, Direction::Send, id) => {
                sent.insert((m.file, m.dst, id), m.t_ns);
            }
            (MessageKind::Response, Direction::Receive, id) => {
                if let Some(t) = sent.remove(&(m.file, m.src, id)) {
                    out.push(m.t_ns.saturating_sub(t) as f64);
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
    use crate::load::assemble;
    use crate::test_files::{file, one_by_one};
    use ulnet_core::trace::format::Record;

    fn trace(records: Vec<Record>) -> load::Trace {
        assemble(vec![("t".into(), file(1, 7, 1_000_000_000, &[(0, 0)], records))])
    }

    #[test]
    fn a_trace_sample_has_a_value_for_each_message_of_a_run() {
        let run = Record { ticks: 100, last_ticks: 500, count: 5, size: 64, buffers: 1, ..Record::default() };
        let run = Record { buffer_len: [64, 0, 0, 0], ..run };
        let single = Record { ticks: 250, last_ticks: 250, count: 1, size: 9, ..Record::default() };
        let handled = Record {
            ticks: 300,
            last_ticks: 300,
            count: 1,
            direction: Direction::Receive as u8,
            src_node: 2,
            exact: true,
            handler_start: 310,
            handler_end: 345,
            ..Record::default()
        };
        let records = vec![run, single, handled];
        let (runs, singles) = (trace(records.clone()), trace(one_by_one(&records)));
        for column in TRACE_COLUMNS.into_iter().filter(|c| *c != "rtt_ns") {
            let sorted = |trace: &load::Trace| {
                let sample = sample_of_trace(trace, "t", Some(column)).unwrap();
                let Arrivals::Times(times) = sample.arrivals else { panic!("a trace's arrivals are times") };
                let mut values = sample.values;
                values.sort_by(f64::total_cmp);
                (values, times)
            };
            assert_eq!(sorted(&runs), sorted(&singles), "{column}");
        }
        let sample = sample_of_trace(&runs, "t", Some("interarrival_ns")).unwrap();
        // The run at 100, 200, ..., 500, the single send at 250, the receive from untraced node 2 at 300.
        assert_eq!(sample.values, [100.0, 50.0, 50.0, 0.0, 100.0, 100.0]);
        assert_eq!(sample_of_trace(&runs, "t", Some("handler_ns")).unwrap().values, [35.0]);
    }

    #[test]
    fn a_trace_of_more_messages_than_a_sample_holds_is_refused() {
        let run = Record { ticks: 1, last_ticks: 2, count: u32::MAX, size: 8, ..Record::default() };
        let e = sample_of_trace(&trace(vec![run]), "t", None).unwrap_err();
        assert!(matches!(e, InputError::TooManyValues { messages, .. } if messages == u64::from(u32::MAX)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("4294967295 messages") && e.contains(&SAMPLE_VALUES_MAX.to_string()), "{e}");
    }

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
