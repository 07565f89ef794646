//! A minimal W3C WebDriver client over reqwest (already a dependency), for
//! the dashboard's browser test: Debian's chromedriver driving Debian's
//! headless Chromium. Both processes are started here and killed on drop.

use serde_json::{json, Value};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::free_port;

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver process (in a process group of its own, with the
/// browsers it starts).
pub struct Driver {
    child: Child,
    pub url: String,
    http: reqwest::Client,
    port: u16,
    sessions: std::sync::Mutex<Vec<String>>,
}

impl Drop for Driver {
    /// Even when a test fails half-way: end each session (chromedriver then
    /// quits its Chromium), then kill chromedriver's process group, so no
    /// browser outlives the test.
    fn drop(&mut self) {
        for id in self.sessions.lock().map(|s| s.clone()).unwrap_or_default() {
            delete_session_blocking(self.port, &id);
        }
        // The group is chromedriver's own (process_group(0) at spawn). The
        // `--` matters: procps-ng 4.0's kill misreads `kill -KILL -<pgid>`
        // for a five-digit pgid and signals something else entirely.
        let pgid = self.child.id();
        if pgid > 1 {
            let _ = Command::new("/usr/bin/kill")
                .args(["-s", "KILL", "--", &format!("-{pgid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `DELETE /session/{id}` without an async runtime (for Drop).
fn delete_session_blocking(port: u16, id: &str) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let req = format!(
        "DELETE /session/{id} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_ok() {
        let _ = s.read_to_end(&mut Vec::new());
    }
}

impl Driver {
    /// Start `/usr/bin/chromedriver` on a free port and wait (with a
    /// deadline) until it says it is ready.
    pub async fn start() -> Self {
        let port = free_port();
        use std::os::unix::process::CommandExt as _;
        let child = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start /usr/bin/chromedriver (scripts/browser.sh install)");
        let d = Driver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            port,
            sessions: Default::default(),
        };
        super::eventually("chromedriver ready", Duration::from_secs(30), || async {
            let r = d.http.get(format!("{}/status", d.url)).send().await.ok()?;
            let v: Value = r.json().await.ok()?;
            v["value"]["ready"].as_bool().filter(|r| *r)
        })
        .await;
        d
    }

    /// A headless Chromium session with a fresh profile in `profile`.
    pub async fn session(&self, profile: &std::path::Path) -> Session {
        let args = [
            "--headless".to_string(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-breakpad".into(),
            "--disable-crash-reporter".into(),
            "--window-size=1280,1000".into(),
            format!("--user-data-dir={}", profile.display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": "/usr/bin/chromium", "args": args}
        }}});
        let v = post(&self.http, &format!("{}/session", self.url), &caps).await;
        let id = v["sessionId"].as_str().expect("a session id").to_string();
        self.sessions.lock().unwrap().push(id.clone());
        Session {
            base: format!("{}/session/{id}", self.url),
            http: self.http.clone(),
        }
    }
}

async fn send(req: reqwest::RequestBuilder) -> Result<Value, Value> {
    let r = req.send().await.expect("webdriver request");
    let ok = r.status().is_success();
    let v: Value = r.json().await.expect("webdriver json");
    if ok {
        Ok(v["value"].clone())
    } else {
        Err(v["value"].clone())
    }
}

async fn post(http: &reqwest::Client, url: &str, body: &Value) -> Value {
    send(http.post(url).json(body))
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"))
}

/// One browser session.
pub struct Session {
    base: String,
    http: reqwest::Client,
}

/// An element of the current page.
pub struct Element<'a> {
    s: &'a Session,
    id: String,
}

impl Session {
    pub async fn goto(&self, url: &str) {
        post(
            &self.http,
            &format!("{}/url", self.base),
            &json!({"url": url}),
        )
        .await;
    }

    pub async fn current_url(&self) -> String {
        send(self.http.get(format!("{}/url", self.base)))
            .await
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    pub async fn source(&self) -> String {
        send(self.http.get(format!("{}/source", self.base)))
            .await
            .unwrap()
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// The element matching `css`, if the current page has one.
    pub async fn try_find(&self, css: &str) -> Option<Element<'_>> {
        let body = json!({"using": "css selector", "value": css});
        let v = match send(self.http.post(format!("{}/element", self.base)).json(&body)).await {
            Ok(v) => v,
            Err(e) if e["error"] == "no such element" => return None,
            Err(e) => panic!("find {css}: {e}"),
        };
        Some(Element {
            s: self,
            id: v[ELEMENT].as_str()?.to_string(),
        })
    }

    pub async fn find(&self, css: &str) -> Element<'_> {
        match self.try_find(css).await {
            Some(e) => e,
            None => panic!(
                "no element {css} on {}:\n{}",
                self.current_url().await,
                self.source().await
            ),
        }
    }

    /// Text of `css`, polled until `pred` holds or the deadline passes
    /// (pages that refresh themselves).
    pub async fn wait_text(
        &self,
        css: &str,
        deadline: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        super::eventually(&format!("{css} as expected"), deadline, || async {
            let e = self.try_find(css).await?;
            let t = e.text_opt().await?;
            pred(&t).then_some(t)
        })
        .await
    }

    pub async fn screenshot(&self, path: &std::path::Path) {
        use base64::Engine as _;
        let v = send(self.http.get(format!("{}/screenshot", self.base)))
            .await
            .unwrap();
        let png = base64::engine::general_purpose::STANDARD
            .decode(v.as_str().unwrap_or_default())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }

    pub async fn delete_cookies(&self) {
        send(self.http.delete(format!("{}/cookie", self.base)))
            .await
            .unwrap();
    }

    /// The text of an open alert dialog, if any (a script that ran).
    pub async fn alert_text(&self) -> Option<String> {
        send(self.http.get(format!("{}/alert/text", self.base)))
            .await
            .ok()
            .map(|v| v.to_string())
    }

    pub async fn close(self) {
        let _ = send(self.http.delete(&self.base)).await;
    }
}

impl Element<'_> {
    fn url(&self, what: &str) -> String {
        format!("{}/element/{}/{what}", self.s.base, self.id)
    }

    pub async fn click(&self) {
        post(&self.s.http, &self.url("click"), &json!({})).await;
    }

    pub async fn clear(&self) {
        post(&self.s.http, &self.url("clear"), &json!({})).await;
    }

    pub async fn send_keys(&self, text: &str) {
        post(&self.s.http, &self.url("value"), &json!({"text": text})).await;
    }

    async fn text_opt(&self) -> Option<String> {
        send(self.s.http.get(self.url("text")))
            .await
            .ok()?
            .as_str()
            .map(str::to_string)
    }

    pub async fn text(&self) -> String {
        self.text_opt().await.unwrap_or_default()
    }
}
