//! A real S3-protocol server for the tests: moto's server (`scripts/venv.sh` installs it into
//! the project's `.venv`), started on a free localhost port for one test and stopped after it.
//! The client under test is dsc's own (object_store's S3 client), not a mock of it. The
//! trainer's tests include this file as well (`#[path]`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Python of the test environment: `DSC_PYTHON`, else the project's `.venv`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("DSC_PYTHON") {
        return p.into();
    }
    // The repository's `.venv`, from the root package or a crate beside it (the trainer's tests
    // include this file too).
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let venv = [
        here.join(".venv/bin/python"),
        here.join("../.venv/bin/python"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| here.join(".venv/bin/python"));
    assert!(
        venv.exists(),
        "no Python environment: run scripts/test.sh (it creates .venv with numpy, safetensors \
         and moto) or set DSC_PYTHON"
    );
    venv
}

/// An S3 server on localhost, killed when dropped.
pub struct S3Server {
    child: Child,
    pub endpoint: String,
}

impl S3Server {
    /// Starts moto's server and waits until it answers.
    pub fn start() -> S3Server {
        // Port 0: the server binds a free port itself and prints it. A port picked here and
        // handed over could be taken by another test's server in between: this one then failed
        // to bind, the other answered the readiness check, and the test's requests were
        // refused once that other server stopped.
        let mut child = Command::new(python())
            .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start moto's S3 server (scripts/venv.sh installs moto[server])");
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads the server's log to its end, so that a full pipe never blocks it.
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in
                std::io::BufRead::lines(std::io::BufReader::new(stderr)).map_while(Result::ok)
            {
                let port = line
                    .split("Running on http://127.0.0.1:")
                    .nth(1)
                    .and_then(|p| p.trim().parse::<u16>().ok());
                if let Some(port) = port {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(port);
                    }
                }
            }
        });
        let port = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("moto's S3 server did not say its port within 60 s");
        let server = S3Server {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
        };
        let start = Instant::now();
        while server.request("GET", "/").is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "moto's S3 server did not answer on port {port} within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn request(&self, method: &str, path: &str) -> std::io::Result<String> {
        let addr = self.endpoint.trim_start_matches("http://");
        let mut s = TcpStream::connect(addr)?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        Ok(reply.lines().next().unwrap_or_default().to_string())
    }

    /// Creates bucket `name`; returns `s3://name`.
    pub fn bucket(&self, name: &str) -> String {
        let status = self
            .request("PUT", &format!("/{name}"))
            .expect("create bucket");
        assert!(status.contains(" 200"), "create bucket {name}: {status}");
        format!("s3://{name}")
    }

    /// The store options that reach this server (dsc's `RemoteOptions::store`).
    pub fn options(&self) -> Vec<(String, String)> {
        self.env()
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect()
    }

    /// The environment that reaches this server, as the AWS tools take it.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", "us-east-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
