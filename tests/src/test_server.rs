//! A throwaway TCP server for the harness's own tests: runs a function on each connection,
//! and on drop stops accepting and closes every connection it accepted.

use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::Duration;

pub(crate) struct TestServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl TestServer {
    /// Serves each connection with `serve` on its own thread; the connection stays open
    /// after `serve` returns, until the server is dropped.
    pub(crate) fn start(serve: impl Fn(TcpStream) + Send + Sync + 'static) -> TestServer {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let serve = Arc::new(serve);
        let acceptor = {
            let (stop, conns) = (stop.clone(), conns.clone());
            thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    if let Ok(kept) = conn.try_clone() {
                        conns
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(kept);
                    }
                    let serve = serve.clone();
                    thread::spawn(move || serve(conn));
                }
            })
        };
        TestServer {
            addr,
            stop,
            conns,
            acceptor: Some(acceptor),
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for conn in self
            .conns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}
