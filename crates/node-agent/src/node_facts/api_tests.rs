//! The node facts' label writer against the fake API server: the four standard tests, one pass at a time over a
//! host made of files (Ubuntu, an A100 on the PCI bus).

use api_test_kit::FakeApi;
use api_test_kit::standard::{self, Retry};
use http::Method;
use tempfile::TempDir;

use super::*;

const NODE: &str = "/api/v1/nodes/node-1";

struct Fixture {
    api: FakeApi,
    node_api: NodeApi,
    args: NodeFactsArgs,
    _host: TempDir,
}

fn fixture() -> Fixture {
    let host = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = host.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("etc/os-release", "ID=ubuntu\nVERSION_ID=\"22.04\"\n");
    write("proc/osrelease", "5.15.0-105-generic\n");
    write("sys/bus/pci/devices/0000:3b:00.0/vendor", "0x10de\n");
    write("sys/bus/pci/devices/0000:3b:00.0/class", "0x030200\n");
    let (api, client) = FakeApi::start();
    let mut node = Node::default();
    node.metadata.name = Some("node-1".into());
    api.insert(&node);
    let args = NodeFactsArgs {
        host_root: host.path().to_owned(),
        kernel_release_file: host.path().join("proc/osrelease"),
        pci_devices_dir: host.path().join("sys/bus/pci/devices"),
        interval: std::time::Duration::from_secs(60),
        node_name: "node-1".into(),
    };
    Fixture {
        api,
        node_api: NodeApi::new(client, "node-1"),
        args,
        _host: host,
    }
}

impl Fixture {
    /// One pass over the Node as the fake API server holds it now (as the watch delivers it).
    async fn pass(&self) -> Result<(), String> {
        let node: Node =
            serde_json::from_value(self.api.object(NODE).expect("the Node")).expect("a Node");
        pass(&self.args, &GpuSource::default(), &self.node_api, &node)
            .await
            .map_err(|error| format!("{error:#}"))
    }

    fn label(&self, key: &str) -> serde_json::Value {
        self.api.object(NODE).unwrap()["metadata"]["labels"][key].clone()
    }
}

const PCI_LABEL: &str = "feature.node.kubernetes.io/pci-10de.present";

#[tokio::test]
async fn standard_unchanged_facts_are_not_written() {
    let fixture = fixture();
    standard::unchanged_is_not_written(&fixture.api, async || fixture.pass().await).await;
}

/// The Node is the kubelet's: what node facts creates on it is its missing labels.
#[tokio::test]
async fn standard_missing_fact_labels_are_created() {
    let fixture = fixture();
    assert!(fixture.label(PCI_LABEL).is_null());
    fixture.pass().await.unwrap();
    assert_eq!(fixture.label(PCI_LABEL), "true");
    assert_eq!(
        fixture.label("feature.node.kubernetes.io/system-os_release.ID"),
        "ubuntu"
    );
}

/// Node facts leaves the retry of a conflicting patch to its loop: the pass fails, the next one writes.
#[tokio::test]
async fn standard_a_conflicting_patch_is_retried_by_the_next_pass() {
    let fixture = fixture();
    standard::conflict_is_retried(
        &fixture.api,
        Method::PATCH,
        NODE,
        Retry::NextPass,
        async || fixture.pass().await,
    )
    .await;
    assert_eq!(fixture.label(PCI_LABEL), "true");
}

#[tokio::test]
async fn standard_a_refused_patch_is_an_error_naming_the_node_and_the_reason() {
    let fixture = fixture();
    standard::refusals_are_errors(
        &fixture.api,
        Method::PATCH,
        NODE,
        "patching node node-1",
        async || fixture.pass().await,
    )
    .await;
}

/// A pass works from the Node as watched: once the labels are right, it sends nothing at all.
#[tokio::test]
async fn a_pass_over_a_labelled_node_sends_no_request() {
    let fixture = fixture();
    fixture.pass().await.unwrap();
    fixture.api.take_requests();
    fixture.pass().await.unwrap();
    assert_eq!(fixture.api.take_requests(), Vec::new());
}
