//! `sparse-knn serve`: the session of `sparse-knn sql`, served over Arrow Flight SQL to many
//! clients (src/serve; docs/serve.md).

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::sql::{run_script, Format, Printer};
use super::{register_location, CliError, CliResult, Location};
use crate::options::parse_bytes;
use crate::serve::{served_session, Limits, ReadRoots, ServeOptions, Server, Token};

/// The environment variable a token is read from when there is no --token-file.
pub const TOKEN_VARIABLE: &str = "SPARSE_KNN_TOKEN";

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on. Without a token only loopback addresses are allowed.
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:50051")]
    pub bind: String,
    /// Register a local Parquet file or folder (or an index file) as a table: NAME=PATH. Its
    /// folder becomes readable by clients.
    #[arg(long = "table", value_name = "NAME=PATH")]
    pub tables: Vec<String>,
    /// SQL files run at start, in order, before any client is served (CREATE EXTERNAL TABLE,
    /// SET, a warm-up lookup that builds an index); they may write, and read under the
    /// allowed folders like clients.
    pub files: Vec<PathBuf>,
    /// File holding the bearer token clients must send (else the environment variable
    /// SPARSE_KNN_TOKEN; with neither, the server listens on loopback only).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// A folder clients may read below (repeatable). Default: the folders of the --table paths.
    #[arg(long = "allow-path", value_name = "DIR")]
    pub allow_paths: Vec<PathBuf>,
    /// Let clients run statements that write or change the shared tables and settings (COPY,
    /// INSERT, CREATE, DROP, SET). Reads stay confined to the allowed folders.
    #[arg(long)]
    pub allow_writes: bool,
    /// Statements that run at once; more wait for a slot.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub max_statements: usize,
    /// Cancel a statement that runs longer, e.g. 30s, 5m, 500ms (default: none).
    #[arg(long, value_name = "DURATION")]
    pub statement_timeout: Option<String>,
    /// Size of the memory pool all statements share, e.g. 8GiB (default: unbounded).
    #[arg(long, value_name = "SIZE")]
    pub memory_limit: Option<String>,
    /// TLS certificate chain (PEM); with --tls-key, clients connect with grpc+tls://.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

pub async fn run(args: ServeArgs) -> CliResult<()> {
    let bind = parse_bind(&args.bind)?;
    let token = read_token(args.token_file.as_deref())?;
    let statement_timeout = args
        .statement_timeout
        .as_deref()
        .map(|t| parse_duration("--statement-timeout", t))
        .transpose()?;
    let memory_limit = args
        .memory_limit
        .as_deref()
        .map(|s| parse_bytes("--memory-limit", s))
        .transpose()
        .map_err(CliError::from_planning)?
        .map(|b| usize::try_from(b).unwrap_or(usize::MAX));
    if args.max_statements == 0 {
        cli_bail!("--max-statements must be at least 1");
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some((read_file("--tls-cert", cert)?, read_file("--tls-key", key)?))
        }
        _ => None,
    };
    let mut tables = Vec::new();
    let mut folders = args.allow_paths.clone();
    for spec in &args.tables {
        let Some((name, path)) = spec.split_once('=') else {
            cli_bail!("--table '{spec}' is not of the form NAME=PATH");
        };
        let what = format!("--table {}", name.trim());
        let location = Location::parse(&what, path)?;
        let Location::Local(local) = &location else {
            cli_bail!("{what}: the server reads local files only");
        };
        if !local.exists() {
            cli_bail!("{what}: '{}' does not exist", local.display());
        }
        folders.push(if local.is_dir() {
            local.clone()
        } else {
            match local.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            }
        });
        tables.push((name.trim().to_string(), location));
    }
    let roots = ReadRoots::new(&folders).map_err(|e| CliError(e.strip_backtrace()))?;
    let ctx = served_session(&roots, memory_limit)?;
    for (name, location) in &tables {
        register_location(&ctx, name, location).await?;
    }
    for file in &args.files {
        let text = std::fs::read_to_string(file)
            .map_err(|e| CliError(format!("cannot read {}: {e}", file.display())))?;
        eprintln!("sparse-knn serve: running {}", file.display());
        run_script(&ctx, &text, &mut Printer::new(Format::Table))
            .await
            .map_err(|e| CliError(format!("{}: {}", file.display(), e.0)))?;
    }
    let options = ServeOptions {
        bind,
        token,
        tls,
        limits: Limits {
            allow_writes: args.allow_writes,
            max_statements: args.max_statements,
            statement_timeout,
        },
    };
    let server = Server::start(ctx, options.clone())
        .await
        .map_err(CliError::from_planning)?;
    let scheme = if options.tls.is_some() {
        "grpc+tls"
    } else {
        "grpc"
    };
    eprintln!(
        "sparse-knn serve: listening on {scheme}://{}; {}; {}; readable: {}; at most {} statements at once{}",
        server.addr(),
        if options.token.is_set() {
            "bearer token required"
        } else {
            "no token: loopback only"
        },
        if args.allow_writes { "writes allowed" } else { "read-only" },
        if roots.roots().is_empty() {
            "no folder (only the tables the start files made)".to_string()
        } else {
            roots.to_string()
        },
        args.max_statements,
        statement_timeout
            .map(|t| format!(", statements cancelled after {t:?}"))
            .unwrap_or_default()
    );
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| CliError(format!("waiting for Ctrl-C: {e}")))?;
    eprintln!("sparse-knn serve: stopping (running statements finish first)");
    server.stop().await?;
    Ok(())
}

fn parse_bind(text: &str) -> CliResult<SocketAddr> {
    let mut addresses = text
        .to_socket_addrs()
        .map_err(|e| CliError(format!("--bind '{text}': {e} (expected HOST:PORT)")))?;
    addresses
        .next()
        .ok_or_else(|| CliError(format!("--bind '{text}' names no address")))
}

/// The token from `file`, else from [`TOKEN_VARIABLE`], else none.
pub fn read_token(file: Option<&Path>) -> CliResult<Token> {
    let (text, from) = match file {
        Some(f) => (
            std::fs::read_to_string(f)
                .map_err(|e| CliError(format!("--token-file {}: {e}", f.display())))?,
            format!("--token-file {}", f.display()),
        ),
        None => match std::env::var(TOKEN_VARIABLE) {
            Ok(t) => (t, TOKEN_VARIABLE.to_string()),
            Err(_) => return Ok(Token::none()),
        },
    };
    Token::new(&text).map_err(|e| CliError(format!("{from}: {e}")))
}

fn read_file(what: &str, path: &Path) -> CliResult<Vec<u8>> {
    std::fs::read(path).map_err(|e| CliError(format!("{what} {}: {e}", path.display())))
}

/// `500ms`, `30s`, `5m`, `1h`, or plain seconds.
pub fn parse_duration(what: &str, text: &str) -> CliResult<Duration> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let seconds = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => cli_bail!("{what} '{text}': unknown unit '{other}' (use ms, s, m or h)"),
    };
    match number.parse::<f64>() {
        Ok(n) if n > 0.0 && (n * seconds).is_finite() => Ok(Duration::from_secs_f64(n * seconds)),
        _ => cli_bail!("{what} '{text}' is not a positive duration such as 30s or 500ms"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_addresses_parse_or_say_why_not() {
        assert_eq!(
            parse_duration("t", "500ms").unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(parse_duration("t", "2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("t", "3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("t", "0s").is_err());
        assert!(parse_duration("t", "5 weeks")
            .unwrap_err()
            .0
            .contains("unknown unit"));
        assert!(parse_bind("127.0.0.1:0").is_ok());
        assert!(parse_bind("nonsense").is_err());
    }
}
