//! The live page at `/` on the stats listener (docs/METRICS.md, "The live page"): its HTML,
//! script and style, and the Chart.js it draws with (vendored from Debian's libjs-chart.js,
//! assets/vendor/chartjs/README.md). They are compiled into the lobby, so that the page needs
//! neither files beside the binary nor the internet; the page itself polls `/status.json`.

const PAGE: &[u8] = include_bytes!("../../assets/status.html");
const SCRIPT: &[u8] = include_bytes!("../../assets/status.js");
const STYLE: &[u8] = include_bytes!("../../assets/status.css");
// Without an icon of its own, the browser would ask for /favicon.ico and log its 404.
const ICON: &[u8] = include_bytes!("../../assets/icon.svg");
const CHART_JS: &[u8] = include_bytes!("../../assets/vendor/chartjs/chart.umd.min.js");

const HTML: &str = "text/html; charset=utf-8";
const JAVASCRIPT: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const SVG: &str = "image/svg+xml";

/// The page's file at `path`: its Content-Type and body.
pub fn file(path: &[u8]) -> Option<(&'static str, &'static [u8])> {
    match path {
        b"/" => Some((HTML, PAGE)),
        b"/assets/status.js" => Some((JAVASCRIPT, SCRIPT)),
        b"/assets/status.css" => Some((CSS, STYLE)),
        b"/assets/icon.svg" => Some((SVG, ICON)),
        b"/assets/chart.umd.min.js" => Some((JAVASCRIPT, CHART_JS)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every file the page names (relative to `/`, where it is served) is served.
    #[test]
    fn serves_every_file_the_page_names() {
        let page = std::str::from_utf8(PAGE).expect("the page is UTF-8");
        let named: Vec<&str> = page.split(['"', '\'']).filter(|word| word.starts_with("assets/")).collect();
        assert_eq!(named, ["assets/icon.svg", "assets/status.css", "assets/chart.umd.min.js", "assets/status.js"]);
        for name in named {
            let path = format!("/{name}");
            assert!(file(path.as_bytes()).is_some(), "{path} is not served");
        }
        assert_eq!(file(b"/").map(|(content_type, _)| content_type), Some(HTML));
    }
}
