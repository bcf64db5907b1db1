//! The OpenAPI document: served as kept in the repository, valid OpenAPI 3.1 by a real
//! validator, and matched by live responses (a property-based API fuzzer, schemathesis,
//! driven by the document against a running server).

use std::process::Command;

use crate::support::*;

/// The tools `scripts/services.sh py-tools` installs (`$CLAMP_PY_TOOLS` to use others).
fn tool(name: &str) -> String {
    let dir = std::env::var("CLAMP_PY_TOOLS")
        .unwrap_or_else(|_| format!("{}/target/py-tools", env!("CARGO_MANIFEST_DIR")));
    let path = format!("{dir}/bin/{name}");
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: run scripts/services.sh py-tools (scripts/test.sh does)"
    );
    path
}

fn document() -> String {
    format!("{}/openapi.json", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn the_document_is_served_as_kept_and_is_valid_openapi() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let served = s.get("/openapi.json").await;
    assert_eq!(served.status, 200);
    assert_eq!(served.headers["content-type"], "application/json");
    assert_eq!(served.body, std::fs::read(document()).unwrap());
    s.shutdown().await;
    let out = Command::new(tool("python"))
        .args(["-m", "openapi_spec_validator", &document()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_responses_match_the_document() {
    let db = TestDb::new();
    let s = TestServer::start(config(&db.url)).await;
    let base = format!("http://{}", s.addr);
    let report = tempdir();
    let schemathesis = tool("schemathesis");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(schemathesis)
            .current_dir(&report)
            .args([
                "run",
                &format!("{base}/openapi.json"),
                "--url",
                &base,
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,\
                 response_headers_conformance,response_schema_conformance,negative_data_rejection",
                "--max-examples",
                "25",
                "--seed",
                "20261201",
                "--no-color",
                "--generation-database",
                "none",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "schemathesis found responses that do not match the document:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(" passed"), "{text}");
    s.shutdown().await;
}

/// A directory of this test's own (schemathesis writes its report there).
fn tempdir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "clamp-openapi-{}-{}",
        std::process::id(),
        fastrand::u32(..)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
