//! `odmesh-demo-grpc`: serves the demo gRPC service, or calls it through the mesh.
//!
//! ```text
//! odmesh-demo-grpc serve --listen 127.0.0.1:18084 --name demo-grpc-1
//! odmesh-demo-grpc call --via 127.0.0.1:15001 --vip demo-grpc --message hi
//! odmesh-demo-grpc call --via 127.0.0.1:15001 --vip demo-grpc --stream 3
//! ```
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use odmesh_demo::{EchoClient, EchoRequest, EchoServer};

#[derive(Parser)]
#[command(about = "The demo gRPC service odmesh.demo.Echo (demo/echo.proto): serve it, or call it")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve odmesh.demo.Echo (HTTP/2 cleartext) until interrupted.
    Serve {
        #[arg(long, default_value = "127.0.0.1:18084")]
        listen: SocketAddr,
        /// The instance name every reply carries.
        #[arg(long, default_value = "demo-grpc")]
        name: String,
    },
    /// Call odmesh.demo.Echo through Envoy, with `:authority` the VIP.
    Call {
        /// Where to send the call: the local Envoy.
        #[arg(long, default_value = "127.0.0.1:15001")]
        via: SocketAddr,
        /// The VIP to call (sent as `:authority`).
        #[arg(long, default_value = "demo-grpc")]
        vip: String,
        #[arg(long, default_value = "hello")]
        message: String,
        /// Call `ServerStream` for this many replies instead of `Unary`.
        #[arg(long)]
        stream: Option<u32>,
        /// The call's deadline (sent as `grpc-timeout`), in milliseconds.
        #[arg(long)]
        deadline_ms: Option<u64>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Serve { listen, name } => {
            let listener = match tokio::net::TcpListener::bind(listen).await {
                Ok(listener) => listener,
                Err(e) => {
                    eprintln!("cannot listen on {listen}: {e}");
                    return ExitCode::FAILURE;
                }
            };
            println!("odmesh.demo.Echo ({name}) on {listen}");
            let interrupted = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            match EchoServer::new(&name).serve(listener, interrupted).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("server failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Call {
            via,
            vip,
            message,
            stream,
            deadline_ms,
        } => match call(via, &vip, &message, stream, deadline_ms).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                ExitCode::FAILURE
            }
        },
    }
}

async fn call(
    via: SocketAddr,
    vip: &str,
    message: &str,
    stream: Option<u32>,
    deadline_ms: Option<u64>,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = EchoClient::connect(via, vip).await?;
    let mut request = tonic::Request::new(EchoRequest {
        count: stream.unwrap_or(0),
        interval_ms: if stream.is_some() { 200 } else { 0 },
        ..EchoRequest::new(message)
    });
    if let Some(ms) = deadline_ms {
        request.set_timeout(Duration::from_millis(ms));
    }
    let show = |r: &odmesh_demo::EchoReply| {
        println!(
            "reply {}: {:?} from {} (received {})",
            r.index, r.message, r.server, r.received
        );
    };
    let status = |s: tonic::Status| format!("{:?}: {}", s.code(), s.message());
    if stream.is_none() {
        let reply = client.unary(request).await.map_err(status)?;
        show(reply.get_ref());
        return Ok(());
    }
    let mut replies = client
        .server_stream(request)
        .await
        .map_err(status)?
        .into_inner();
    while let Some(reply) = replies.message().await.map_err(status)? {
        show(&reply);
    }
    if let Some(trailers) = replies.trailers().await.map_err(status)? {
        println!("trailers: {:?}", trailers.into_headers());
    }
    Ok(())
}
