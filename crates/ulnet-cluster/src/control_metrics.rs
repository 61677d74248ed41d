//! What a node's control plane (its TCP endpoint: clients and members connecting, RPC
//! channels coming and going) did, and its Prometheus text (`ulnet_control_*`).

use ulnet_core::transport::tcp::TcpListenerCounters;
use ulnet_core::Endpoint;

/// The control plane's counters and gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ControlCounters {
    /// What the listener did with the connections it took.
    pub listener: TcpListenerCounters,
    /// Connections in their handshake now.
    pub handshakes_pending: u64,
    /// Channels open now (clients, members; accepted and opened).
    pub channels_open: u64,
    /// Channels whose peer closed them cleanly.
    pub channels_closed_by_peer: u64,
    /// Channels whose peer vanished, reset or broke the protocol (evicted ones included).
    pub channels_failed: u64,
    /// Accepted channels closed to make room for new ones (the bound on accepted channels).
    pub channels_evicted: u64,
}

impl ControlCounters {
    /// The counters of the control plane's endpoint now.
    pub fn of(ep: &Endpoint) -> Self {
        let c = ep.counters();
        Self {
            listener: ep.tcp_listener_counters(),
            handshakes_pending: ep.tcp_handshakes_pending() as u64,
            channels_open: ep.channels_open() as u64,
            channels_closed_by_peer: c.channels_closed_by_peer,
            channels_failed: c.channels_failed,
            channels_evicted: c.channels_evicted,
        }
    }
}

/// The counters in Prometheus text exposition format.
pub fn prometheus_text(c: &ControlCounters) -> String {
    let l = &c.listener;
    let counters: [(&str, &str, u64); 8] = [
        ("connections_accepted_total", "Connections taken from the control port's queue.", l.connections_accepted),
        ("handshakes_completed_total", "Handshakes that made a channel.", l.handshakes_completed),
        ("handshakes_timed_out_total", "Connections closed for not finishing their handshake in time.", l.timed_out),
        (
            "handshakes_dropped_total",
            "Connections in their handshake closed for newer ones (the bound on handshakes at once, or no descriptor left).",
            l.dropped_for_bound,
        ),
        (
            "accept_failed_total",
            "Accepts that failed for lack of file descriptors or memory (see the node's log).",
            l.accept_failed,
        ),
        ("channels_closed_by_peer_total", "Channels the peer closed cleanly.", c.channels_closed_by_peer),
        ("channels_failed_total", "Channels whose peer vanished, reset or broke the protocol.", c.channels_failed),
        ("channels_evicted_total", "Accepted channels closed, idle longest, to make room.", c.channels_evicted),
    ];
    let mut out = String::new();
    for (name, help, value) in counters {
        out += &format!(
            "# HELP ulnet_control_{name} {help}\n# TYPE ulnet_control_{name} counter\nulnet_control_{name} {value}\n"
        );
    }
    out += "# HELP ulnet_control_handshakes_refused_total Handshakes refused, by reason.\n";
    out += "# TYPE ulnet_control_handshakes_refused_total counter\n";
    let refused = [
        ("not_ulnet", l.refused_not_ulnet),
        ("version", l.refused_version),
        ("bad_secret", l.refused_bad_secret),
        ("closed", l.refused_closed),
    ];
    for (reason, value) in refused {
        out += &format!("ulnet_control_handshakes_refused_total{{reason=\"{reason}\"}} {value}\n");
    }
    let gauges = [
        ("handshakes_pending", "Connections in their handshake now.", c.handshakes_pending),
        ("channels_open", "Control-plane channels open now.", c.channels_open),
    ];
    for (name, help, value) in gauges {
        out += &format!(
            "# HELP ulnet_control_{name} {help}\n# TYPE ulnet_control_{name} gauge\nulnet_control_{name} {value}\n"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_a_sample_with_its_help_and_type() {
        let mut c = ControlCounters::default();
        c.listener.refused_bad_secret = 3;
        c.listener.dropped_for_bound = 5;
        c.channels_open = 2;
        let text = prometheus_text(&c);
        assert!(text.contains("ulnet_control_handshakes_refused_total{reason=\"bad_secret\"} 3\n"), "{text}");
        assert!(text.contains("ulnet_control_handshakes_dropped_total 5\n"), "{text}");
        assert!(text.contains("# TYPE ulnet_control_channels_open gauge\nulnet_control_channels_open 2\n"), "{text}");
        let samples = text.lines().filter(|l| !l.starts_with('#')).count();
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        assert_eq!((samples, types), (8 + 4 + 2, 8 + 1 + 2));
    }
}
