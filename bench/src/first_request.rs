//! The first request to a never-seen VIP against warm requests to it, through an Envoy
//! listener, over plain blocking HTTP/1.1 keep-alive connections.
//!
//! For each VIP: open a connection (not timed), time the first request (Envoy discovers the
//! cluster meanwhile), then time `warm` more requests on the same connection. One JSON object
//! per VIP on stdout: microseconds of the first request and of each warm one, and the statuses.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;

use crate::registry_gen::vip_name;

/// What `first-request` probes.
#[derive(Clone, Debug, Args)]
pub struct FirstArgs {
    /// The Envoy listener.
    #[arg(long, default_value = "127.0.0.1:15001")]
    pub envoy: SocketAddr,
    /// VIP name prefix (names are `<prefix><index:06>`, as `gen-registry` writes them).
    #[arg(long, default_value = "svc-")]
    pub prefix: String,
    /// First VIP index.
    #[arg(long, default_value_t = 0)]
    pub start: usize,
    /// How many VIPs.
    #[arg(long, default_value_t = 200)]
    pub count: usize,
    /// Warm requests per VIP after the first.
    #[arg(long, default_value_t = 5)]
    pub warm: usize,
    /// Pause between VIPs, in milliseconds (lets Envoy's main thread go idle).
    #[arg(long, default_value_t = 20)]
    pub gap_ms: u64,
}

/// One HTTP/1.1 GET on `conn`; returns the status.
fn get(conn: &mut BufReader<TcpStream>, host: &str) -> io::Result<u16> {
    let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: odmesh-bench\r\n\r\n");
    conn.get_mut().write_all(req.as_bytes())?;
    let mut line = String::new();
    conn.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("bad status line {line:?}")))?;
    let mut length = 0usize;
    loop {
        line.clear();
        if conn.read_line(&mut line)? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; length];
    conn.read_exact(&mut body)?;
    Ok(status)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `first-request`.
pub fn run(a: &FirstArgs) -> anyhow::Result<()> {
    for index in a.start..a.start + a.count {
        let host = vip_name(&a.prefix, index);
        let stream = TcpStream::connect(a.envoy)?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut conn = BufReader::new(stream);
        let t = Instant::now();
        let first_status = get(&mut conn, &host)?;
        let first = micros(t.elapsed());
        let mut warm = Vec::with_capacity(a.warm);
        let mut warm_status = 0;
        for _ in 0..a.warm {
            let t = Instant::now();
            warm_status = get(&mut conn, &host)?;
            warm.push(micros(t.elapsed()));
        }
        println!(
            "{}",
            serde_json::json!({
                "vip": host, "first_us": first, "warm_us": warm,
                "first_status": first_status, "warm_status": warm_status,
            })
        );
        thread::sleep(Duration::from_millis(a.gap_ms));
    }
    Ok(())
}
