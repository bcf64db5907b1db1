//! The `clamp` binary: parse configuration, start logging and the server, wait for a
//! signal, shut down gracefully.

use mimalloc::MiMalloc;

#[global_allocator]
static GLOBAL: MiMalloc = MiMalloc;

fn main() -> std::process::ExitCode {
    // `clamp workflows apply|export …`: definitions as files (no server is started).
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("workflows") {
        return clamp::workflow_files::main(args[1..].to_vec());
    }
    let config = match clamp::config::Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("clamp: {e}");
            std::process::exit(2);
        }
    };
    // The broker clients narrate every connection at info; a bare level keeps them to
    // warnings (a full directive such as `info,rskafka=info` is taken as given).
    let directive = if config.log_level.contains(['=', ',']) {
        config.log_level.clone()
    } else {
        format!("{},rskafka=warn,lapin=warn", config.log_level)
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&directive)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: log files and `docker logs` get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match config.log_format {
        // One object per line, the event's fields at the top level beside `message`.
        clamp::telemetry::LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
        clamp::telemetry::LogFormat::Text => logs.with_ansi(ansi).init(),
    }
    for why in &config.ignored {
        tracing::warn!("{why}");
    }
    match clamp::runtime::raise_nofile_limit() {
        Ok((old, new)) => tracing::info!(old, new, "RLIMIT_NOFILE soft limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise RLIMIT_NOFILE"),
    }
    // A small runtime for startup work and signals; requests are served on the cores.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime starts");
    let code = rt.block_on(async {
        let server = match clamp::start(config).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("clamp: {e}");
                return 1;
            }
        };
        wait_for_signal().await;
        tracing::info!("shutting down");
        server.shutdown().await;
        tracing::info!("stopped");
        0
    });
    std::process::exit(code);
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler installs");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler installs");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
