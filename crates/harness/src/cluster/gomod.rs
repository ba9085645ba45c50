//! The throwaway Go modules that the tools are built from, and the bits of the Go module proxy protocol we use.
//! Everything here is pure text in, text out.

use super::versions::{GO_MINIMUM, GoTool};

/// The module proxy used when `GOPROXY` names none we can use.
pub const DEFAULT_PROXY: &str = "https://proxy.golang.org";

/// The module proxy to fetch from: the first entry of `GOPROXY` when it is an `https://` URL, else
/// [`DEFAULT_PROXY`] (`direct`, `off`, file URLs and plain HTTP are not something we fetch from).
pub fn module_proxy(goproxy: Option<&str>) -> String {
    goproxy
        .and_then(|list| list.split([',', '|']).next())
        .map(str::trim)
        .filter(|first| first.starts_with("https://"))
        .map_or_else(
            || DEFAULT_PROXY.to_owned(),
            |first| first.trim_end_matches('/').to_owned(),
        )
}

/// A module path as the proxy protocol spells it: every upper-case letter becomes `!` and its lower-case form.
pub fn escape_module_path(path: &str) -> String {
    let mut escaped = String::with_capacity(path.len());
    for c in path.chars() {
        if c.is_ascii_uppercase() {
            escaped.push('!');
            escaped.push(c.to_ascii_lowercase());
        } else {
            escaped.push(c);
        }
    }
    escaped
}

/// `<proxy>/<module>/@v/<version>.<ext>`, e.g. the `.mod` or `.zip` of a module version.
pub fn proxy_url(proxy: &str, module: &str, version: &str, ext: &str) -> String {
    format!("{proxy}/{}/@v/{version}.{ext}", escape_module_path(module))
}

/// The module paths that a go.mod replaces with a directory under `./staging/` (how `k8s.io/kubernetes` points at
/// its own `k8s.io/*` libraries). Sorted, without duplicates.
pub fn staging_replaces(go_mod: &str) -> Vec<String> {
    let mut modules = Vec::new();
    let mut in_block = false;
    for raw in go_mod.lines() {
        let line = raw.split("//").next().unwrap_or_default().trim();
        let directive = if in_block {
            if line == ")" {
                in_block = false;
                continue;
            }
            line
        } else if let Some(rest) = line.strip_prefix("replace") {
            let rest = rest.trim();
            if rest == "(" {
                in_block = true;
                continue;
            }
            rest
        } else {
            continue;
        };
        let Some((old, new)) = directive.split_once("=>") else {
            continue;
        };
        let (Some(module), Some(target)) =
            (old.split_whitespace().next(), new.split_whitespace().next())
        else {
            continue;
        };
        if target.starts_with("./staging/") {
            modules.push(module.to_owned());
        }
    }
    modules.sort();
    modules.dedup();
    modules
}

/// The go.mod of the throwaway module that builds `tool`: it requires the tool's module and replaces each of
/// `replaced` with its published version `replace_version`.
pub fn render_go_mod(tool: &GoTool, replaced: &[String], replace_version: &str) -> String {
    let mut text = format!(
        "module localbuild/{}\n\ngo {GO_MINIMUM}\n\nrequire {} {}\n",
        tool.name, tool.module, tool.version
    );
    if !replaced.is_empty() {
        text.push_str("\nreplace (\n");
        for module in replaced {
            text.push_str(&format!("\t{module} => {module} {replace_version}\n"));
        }
        text.push_str(")\n");
    }
    text
}

/// A `tools.go` (build tag `tools`, so never compiled) whose blank imports make `go mod tidy` keep everything the
/// main packages need.
pub fn render_tools_go(packages: &[&str]) -> String {
    let mut text = String::from("//go:build tools\n\npackage tools\n\nimport (\n");
    for package in packages {
        text.push_str(&format!("\t_ \"{package}\"\n"));
    }
    text.push_str(")\n");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::versions;

    const UPSTREAM_SAMPLE: &str = r#"// This is a generated file. Do not edit directly.

module k8s.io/kubernetes

go 1.26.0

require (
	github.com/spf13/cobra v1.10.2
	k8s.io/api v0.0.0
	k8s.io/client-go v0.0.0 // indirect
)

replace github.com/example/fork => github.com/example/fork v1.2.3

replace k8s.io/kms => ./staging/src/k8s.io/kms // single-line form

replace (
	k8s.io/api => ./staging/src/k8s.io/api
	k8s.io/client-go v0.0.0 => ./staging/src/k8s.io/client-go
	// k8s.io/commented-out => ./staging/src/k8s.io/commented-out
	k8s.io/api => ./staging/src/k8s.io/api
	example.com/elsewhere => ../elsewhere
)
"#;

    #[test]
    fn finds_every_staging_replace_and_nothing_else() {
        assert_eq!(
            staging_replaces(UPSTREAM_SAMPLE),
            vec!["k8s.io/api", "k8s.io/client-go", "k8s.io/kms"]
        );
        assert!(staging_replaces("module x\n\nrequire k8s.io/api v0.37.1\n").is_empty());
    }

    #[test]
    fn renders_the_kubernetes_module() {
        let replaced = staging_replaces(UPSTREAM_SAMPLE);
        let go_mod = render_go_mod(&versions::kubernetes(), &replaced, "v0.37.1");
        assert_eq!(
            go_mod,
            "module localbuild/kubernetes\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes v1.37.1\n\nreplace (\n\
             \tk8s.io/api => k8s.io/api v0.37.1\n\
             \tk8s.io/client-go => k8s.io/client-go v0.37.1\n\
             \tk8s.io/kms => k8s.io/kms v0.37.1\n)\n"
        );
    }

    #[test]
    fn renders_a_module_without_replaces() {
        assert_eq!(
            render_go_mod(&versions::kwok(), &[], "unused"),
            "module localbuild/kwok\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kwok v0.8.0\n"
        );
    }

    #[test]
    fn renders_tools_go_with_the_tools_build_tag() {
        assert_eq!(
            render_tools_go(&["a.io/x/cmd/y", "b.io/z"]),
            "//go:build tools\n\npackage tools\n\nimport (\n\t_ \"a.io/x/cmd/y\"\n\t_ \"b.io/z\"\n)\n"
        );
    }

    #[test]
    fn picks_the_first_https_proxy() {
        assert_eq!(module_proxy(None), DEFAULT_PROXY);
        assert_eq!(
            module_proxy(Some("https://proxy.golang.org,direct")),
            "https://proxy.golang.org"
        );
        assert_eq!(
            module_proxy(Some("https://goproxy.example/|https://other")),
            "https://goproxy.example"
        );
        assert_eq!(module_proxy(Some("direct")), DEFAULT_PROXY);
        assert_eq!(module_proxy(Some("off")), DEFAULT_PROXY);
        assert_eq!(
            module_proxy(Some("http://plain.example,direct")),
            DEFAULT_PROXY
        );
        assert_eq!(module_proxy(Some("")), DEFAULT_PROXY);
    }

    #[test]
    fn escapes_upper_case_in_proxy_urls() {
        assert_eq!(
            proxy_url(DEFAULT_PROXY, "k8s.io/kubernetes", "v1.37.1", "mod"),
            "https://proxy.golang.org/k8s.io/kubernetes/@v/v1.37.1.mod"
        );
        assert_eq!(
            escape_module_path("github.com/Azure/go-ansiterm"),
            "github.com/!azure/go-ansiterm"
        );
    }
}
