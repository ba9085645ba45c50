//! The stateful mode's objects and how the API server treats them, as far as our writers depend on it: objects
//! by path; `status` written only through the `/status` subresource; a write carrying a stale `resourceVersion`
//! (or a delete with stale preconditions) refused with 409 Conflict; server-side apply creating what is missing;
//! objects with finalizers only marked for deletion; an eviction deleting its pod; label and field selectors on
//! lists. Not modelled: field ownership (an apply merges into what is stored, so a field a manager
//! stops sending stays), and timestamps (tests that need them set them).

use std::collections::BTreeMap;

use http::Method;
use serde_json::{Map, Value, json};

use crate::{Request, status};

/// Where a path points: a collection, an object of it, or a subresource of that object.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `/api/v1` or `/apis/<group>/<version>`.
    group_version: String,
    namespace: Option<String>,
    plural: String,
    name: Option<String>,
    subresource: Option<String>,
}

impl Target {
    fn parse(path: &str) -> Option<Self> {
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let prefix = match *segments.first()? {
            "api" => 2,
            "apis" => 3,
            _ => return None,
        };
        let rest = segments.get(prefix..).filter(|rest| !rest.is_empty())?;
        let (namespace, rest) = match rest {
            ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
                (Some((*namespace).to_owned()), rest)
            }
            _ => (None, rest),
        };
        let owned = |segment: Option<&&str>| segment.map(|segment| (*segment).to_owned());
        Some(Self {
            group_version: format!("/{}", segments[..prefix].join("/")),
            namespace,
            plural: rest[0].to_owned(),
            name: owned(rest.get(1)),
            subresource: owned(rest.get(2)),
        })
    }

    /// The object's path (without a subresource).
    fn path(&self, name: &str) -> String {
        match &self.namespace {
            Some(namespace) => format!(
                "{}/namespaces/{namespace}/{}/{name}",
                self.group_version, self.plural
            ),
            None => format!("{}/{}/{name}", self.group_version, self.plural),
        }
    }

    /// Whether the object at `object` lies in this collection (a list without a namespace spans them all).
    fn holds(&self, object: &Target) -> bool {
        self.group_version == object.group_version
            && self.plural == object.plural
            && (self.namespace.is_none() || self.namespace == object.namespace)
    }

    fn not_found(&self, name: &str) -> (u16, Value) {
        let message = format!("{} \"{name}\" not found", self.plural);
        (404, status(404, "NotFound", &message))
    }

    fn conflict(&self, name: &str) -> (u16, Value) {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your \
             changes to the latest version and try again",
            self.plural
        );
        (409, status(409, "Conflict", &message))
    }
}

/// The objects, by path, and the last resourceVersion given out.
#[derive(Debug, Default)]
pub(crate) struct Store {
    objects: BTreeMap<String, Value>,
    version: u64,
}

impl Store {
    pub(crate) fn get(&self, path: &str) -> Option<&Value> {
        self.objects.get(path)
    }

    /// The objects whose path starts with `prefix`, in path order.
    pub(crate) fn under(&self, prefix: &str) -> Vec<Value> {
        let objects = self.objects.range(prefix.to_owned()..);
        objects
            .take_while(|(path, _)| path.starts_with(prefix))
            .map(|(_, object)| object.clone())
            .collect()
    }

    pub(crate) fn remove(&mut self, path: &str) {
        self.objects.remove(path);
    }

    /// Stores `object` at `path` with a new resourceVersion (and a uid when it has none); returns it as stored.
    pub(crate) fn insert(&mut self, path: String, mut object: Value) -> Value {
        self.version += 1;
        let metadata = &mut object["metadata"];
        metadata["resourceVersion"] = json!(self.version.to_string());
        if metadata["uid"].is_null() {
            metadata["uid"] = json!(format!("uid-{}", self.version));
        }
        self.objects.insert(path, object.clone());
        object
    }

    /// The API server's answer to `request`: its HTTP code and JSON body.
    pub(crate) fn answer(&mut self, request: &Request, content_type: &str) -> (u16, Value) {
        let Some(target) = Target::parse(&request.path) else {
            let message = format!("the fake API server has no {}", request.path);
            return (404, status(404, "NotFound", &message));
        };
        let body = &request.body;
        let Some(name) = target.name.clone() else {
            return match request.method {
                Method::GET => (200, self.list(&target, &request.query)),
                Method::POST => self.create(&target, body.clone()),
                Method::DELETE => self.delete_all(&target, &request.query),
                _ => method_not_allowed(request),
            };
        };
        let status_only = target.subresource.as_deref() == Some("status");
        match (&request.method, target.subresource.as_deref()) {
            (&Method::GET, None | Some("status")) => match self.objects.get(&target.path(&name)) {
                Some(object) => (200, object.clone()),
                None => target.not_found(&name),
            },
            (&Method::PATCH, None | Some("status")) => {
                let apply = content_type.starts_with("application/apply-patch");
                self.patch(&target, &name, body, apply, status_only)
            }
            (&Method::PUT, None | Some("status")) => {
                self.replace(&target, &name, body, status_only)
            }
            (&Method::DELETE, None) => self.delete(&target, &name, body),
            (&Method::POST, Some("eviction")) => match self.objects.remove(&target.path(&name)) {
                Some(_) => (
                    201,
                    json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201}),
                ),
                None => target.not_found(&name),
            },
            _ => method_not_allowed(request),
        }
    }

    /// A list of the collection's objects that the query's selectors select.
    fn list(&self, collection: &Target, query: &str) -> Value {
        let items: Vec<&Value> = self
            .objects
            .iter()
            .filter(|(path, _)| Target::parse(path).is_some_and(|object| collection.holds(&object)))
            .map(|(_, object)| object)
            .filter(|object| selected(object, query))
            .collect();
        json!({
            "apiVersion": "v1", "kind": "List",
            "metadata": {"resourceVersion": self.version.to_string()},
            "items": items,
        })
    }

    fn create(&mut self, collection: &Target, mut object: Value) -> (u16, Value) {
        let name = match object["metadata"]["name"].as_str() {
            Some(name) => name.to_owned(),
            None => format!(
                "{}{}",
                object["metadata"]["generateName"]
                    .as_str()
                    .unwrap_or_default(),
                self.version + 1
            ),
        };
        let path = collection.path(&name);
        if self.objects.contains_key(&path) {
            let message = format!("{} \"{name}\" already exists", collection.plural);
            return (409, status(409, "AlreadyExists", &message));
        }
        if let Some(object) = object.as_object_mut() {
            object.remove("status");
        }
        object["metadata"]["name"] = json!(name);
        if let Some(namespace) = &collection.namespace {
            object["metadata"]["namespace"] = json!(namespace);
        }
        object["metadata"]["generation"] = json!(1);
        (201, self.insert(path, object))
    }

    fn patch(
        &mut self,
        target: &Target,
        name: &str,
        patch: &Value,
        apply: bool,
        status_only: bool,
    ) -> (u16, Value) {
        let Some(stored) = self.objects.get(&target.path(name)).cloned() else {
            // Server-side apply creates what is missing; any other patch, and any write of a status, needs it.
            return if apply && !status_only {
                let mut object = patch.clone();
                object["metadata"]["name"] = json!(name);
                self.create(target, object)
            } else {
                target.not_found(name)
            };
        };
        if stale(&stored, patch) {
            return target.conflict(name);
        }
        let mut updated = stored.clone();
        if status_only {
            if let Some(status) = patch.get("status") {
                merge(&mut updated["status"], status);
            }
        } else {
            merge(&mut updated, &without_status(patch));
        }
        (200, self.update(target.path(name), &stored, updated))
    }

    fn replace(
        &mut self,
        target: &Target,
        name: &str,
        object: &Value,
        status_only: bool,
    ) -> (u16, Value) {
        let Some(stored) = self.objects.get(&target.path(name)).cloned() else {
            return target.not_found(name);
        };
        if stale(&stored, object) {
            return target.conflict(name);
        }
        let mut updated = if status_only {
            stored.clone()
        } else {
            without_status(object)
        };
        updated["status"] = if status_only {
            object["status"].clone()
        } else {
            stored["status"].clone()
        };
        if updated["status"].is_null() {
            updated
                .as_object_mut()
                .map(|object| object.remove("status"));
        }
        updated["metadata"]["uid"] = stored["metadata"]["uid"].clone();
        updated["metadata"]["generation"] = stored["metadata"]["generation"].clone();
        (200, self.update(target.path(name), &stored, updated))
    }

    /// Stores a changed object; its generation moves on when more than metadata and status changed.
    fn update(&mut self, path: String, stored: &Value, mut updated: Value) -> Value {
        let spec = |object: &Value| {
            let mut object = without_status(object);
            object
                .as_object_mut()
                .map(|object| object.remove("metadata"));
            object
        };
        if spec(stored) != spec(&updated) {
            let generation = stored["metadata"]["generation"].as_i64().unwrap_or(0);
            updated["metadata"]["generation"] = json!(generation + 1);
        }
        self.insert(path, updated)
    }

    /// Deletes an object: a stale precondition is a conflict, and an object with finalizers is only marked.
    fn delete(&mut self, target: &Target, name: &str, options: &Value) -> (u16, Value) {
        let path = target.path(name);
        let Some(stored) = self.objects.get(&path).cloned() else {
            return target.not_found(name);
        };
        let preconditions = &options["preconditions"];
        let differs = |field: &str| {
            !preconditions[field].is_null() && preconditions[field] != stored["metadata"][field]
        };
        if differs("resourceVersion") || differs("uid") {
            return target.conflict(name);
        }
        let finalized = stored["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|finalizers| !finalizers.is_empty());
        if finalized {
            let mut marked = stored;
            marked["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            return (200, self.insert(path, marked));
        }
        self.objects.remove(&path);
        (200, stored)
    }

    fn delete_all(&mut self, collection: &Target, query: &str) -> (u16, Value) {
        let deleted = self.list(collection, query);
        self.objects.retain(|path, object| {
            !(Target::parse(path).is_some_and(|object| collection.holds(&object))
                && selected(object, query))
        });
        (200, deleted)
    }
}

fn method_not_allowed(request: &Request) -> (u16, Value) {
    let message = format!("the fake API server has no {}", request.line());
    (405, status(405, "MethodNotAllowed", &message))
}

/// Whether a write names a resourceVersion other than the stored one (optimistic concurrency).
fn stale(stored: &Value, write: &Value) -> bool {
    let version = &write["metadata"]["resourceVersion"];
    !version.is_null() && *version != stored["metadata"]["resourceVersion"]
}

fn without_status(object: &Value) -> Value {
    let mut object = object.clone();
    if let Some(fields) = object.as_object_mut() {
        fields.remove("status");
    }
    object
}

/// A JSON merge patch (RFC 7386): objects merge, `null` removes, anything else replaces.
fn merge(target: &mut Value, patch: &Value) {
    let Some(fields) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let target = target.as_object_mut().expect("an object");
    for (key, value) in fields {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Whether `object` is selected by the query's `labelSelector` and `fieldSelector`: terms `key=value`,
/// `key==value`, `key!=value`, `key`, `!key`, `key in (a,b)` and `key notin (a,b)`; a field is a dotted path
/// into the object.
fn selected(object: &Value, query: &str) -> bool {
    params(query).all(|(key, selector)| {
        let lookup: &dyn Fn(&str) -> Option<String> = match key.as_str() {
            "labelSelector" => &|label| {
                object["metadata"]["labels"][label]
                    .as_str()
                    .map(str::to_owned)
            },
            "fieldSelector" => &|field| {
                let value = field.split('.').fold(object, |value, part| &value[part]);
                match value {
                    Value::Null => None,
                    Value::String(text) => Some(text.clone()),
                    other => Some(other.to_string()),
                }
            },
            _ => return true,
        };
        terms(&selector).all(|term| matches(term.trim(), lookup))
    })
}

/// A selector's terms: split at the commas outside parentheses.
fn terms(selector: &str) -> impl Iterator<Item = &str> {
    let mut depth = 0;
    selector
        .split(move |c| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            c == ',' && depth == 0
        })
        .filter(|term| !term.is_empty())
}

fn matches(term: &str, lookup: &dyn Fn(&str) -> Option<String>) -> bool {
    let set = |values: &str| -> Vec<String> {
        let values = values.trim().trim_start_matches('(').trim_end_matches(')');
        values
            .split(',')
            .map(|value| value.trim().to_owned())
            .collect()
    };
    if let Some((key, values)) = term.split_once(" notin ") {
        !lookup(key.trim()).is_some_and(|value| set(values).contains(&value))
    } else if let Some((key, values)) = term.split_once(" in ") {
        lookup(key.trim()).is_some_and(|value| set(values).contains(&value))
    } else if let Some((key, value)) = term.split_once("!=") {
        lookup(key).as_deref() != Some(value)
    } else if let Some((key, value)) = term.split_once('=') {
        lookup(key).as_deref() == Some(value.trim_start_matches('='))
    } else if let Some(key) = term.strip_prefix('!') {
        lookup(key).is_none()
    } else {
        lookup(term).is_some()
    }
}

/// A query's parameters, decoded.
pub(crate) fn params(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
}

/// URL decoding: `%XX` and `+`.
fn decode(text: &str) -> String {
    let mut bytes = Vec::with_capacity(text.len());
    let mut rest = text.as_bytes();
    while let Some((&first, tail)) = rest.split_first() {
        let hex = tail
            .get(..2)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (first, hex) {
            (b'%', Some(byte)) => {
                bytes.push(byte);
                rest = &tail[2..];
            }
            (b'+', _) => {
                bytes.push(b' ');
                rest = tail;
            }
            (byte, _) => {
                bytes.push(byte);
                rest = tail;
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_collection_object_and_subresource() {
        let target = Target::parse("/apis/nvidia.com/v1alpha1/gpunodes/gpu-0/status").unwrap();
        assert_eq!(
            (
                target.group_version.as_str(),
                target.namespace,
                target.plural.as_str()
            ),
            ("/apis/nvidia.com/v1alpha1", None, "gpunodes")
        );
        assert_eq!(
            (target.name.as_deref(), target.subresource.as_deref()),
            (Some("gpu-0"), Some("status"))
        );
        let namespace = Target::parse("/api/v1/namespaces/gpu-operator").unwrap();
        assert_eq!(
            (namespace.plural.as_str(), namespace.name.as_deref()),
            ("namespaces", Some("gpu-operator"))
        );
        let pods = Target::parse("/api/v1/namespaces/default/pods").unwrap();
        assert_eq!(
            (pods.namespace.as_deref(), pods.name),
            (Some("default"), None)
        );
        assert!(
            Target::parse("/api/v1/pods")
                .unwrap()
                .holds(&Target::parse("/api/v1/namespaces/a/pods/p").unwrap())
        );
    }

    #[test]
    fn selectors_select_by_label_and_field() {
        let pod = json!({"metadata": {"labels": {"app": "x"}}, "spec": {"nodeName": "gpu-0"}});
        assert!(selected(
            &pod,
            "labelSelector=app%3Dx&fieldSelector=spec.nodeName%3Dgpu-0"
        ));
        assert!(selected(&pod, "labelSelector=app,!other"));
        assert!(!selected(&pod, "labelSelector=app!%3Dx"));
        assert!(!selected(&pod, "fieldSelector=spec.nodeName%3Dgpu-1"));
        assert!(selected(&pod, "labelSelector=app+in+%28y%2Cx%29,!b"));
        assert!(!selected(&pod, "labelSelector=app+notin+%28y%2Cx%29"));
    }

    #[test]
    fn a_merge_patch_removes_nulls_and_replaces_the_rest() {
        let mut object = json!({"a": {"b": 1, "c": 2}, "d": [1]});
        merge(&mut object, &json!({"a": {"b": null, "e": 3}, "d": [2]}));
        assert_eq!(object, json!({"a": {"c": 2, "e": 3}, "d": [2]}));
    }
}
