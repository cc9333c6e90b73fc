//! The `kubectl` forms the tests run most, answered in-process with what a `kubectl` process
//! would have answered: `create namespace NAME`, `create -f FILE` and `apply -f FILE` (`-` for
//! standard input), each with an optional `-n NAMESPACE`. Counted over a whole run they were
//! about 400 `kubectl` processes, each with its own start (about 130 ms of CPU) and its
//! discovery of a server it had never seen. Every other form (an output format, an identity,
//! a dry run, another verb) runs `kubectl`, as does a file this module cannot read.
//!
//! What stays kubectl's: the exit status (0, or 1 when any object failed), a line per object
//! on stdout (`configmap/x created`), and the server's refusal on stderr, with its reason
//! (`Error from server (Invalid): error when creating "STDIN": ...`), every object tried in
//! order. `apply` is server-side apply taking fields over (client-side apply never
//! conflicts), with kubectl's strict field validation; `create` is a create.
use std::{
    os::unix::process::ExitStatusExt as _,
    path::Path,
    process::{ExitStatus, Output},
};

use kube::{
    Api,
    api::{DynamicObject, Patch, PatchParams, PostParams, ValidationDirective},
    discovery::Scope,
};
use serde_json::Value;

use crate::kube_sync::{Kinds, api_in, block, client, flattened};

/// What the arguments ask for, when this module can answer it.
#[derive(Debug, PartialEq, Eq)]
enum Form<'a> {
    CreateNamespace(&'a str),
    Objects {
        verb: Verb,
        file: &'a str,
        namespace: Option<&'a str>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Create,
    Apply,
}

fn form<'a>(args: &[&'a str]) -> Option<Form<'a>> {
    match args {
        ["create", "namespace" | "ns", name] if !name.starts_with('-') => {
            return Some(Form::CreateNamespace(name));
        }
        _ => {}
    }
    let (verb, mut rest) = match args.split_first()? {
        (&"create", rest) => (Verb::Create, rest),
        (&"apply", rest) => (Verb::Apply, rest),
        _ => return None,
    };
    let (mut file, mut namespace) = (None, None);
    while let Some((flag, tail)) = rest.split_first() {
        let (value, tail) = tail.split_first()?;
        match *flag {
            "-f" | "--filename" if file.is_none() => file = Some(*value),
            "-n" | "--namespace" if namespace.is_none() => namespace = Some(*value),
            _ => return None,
        }
        rest = tail;
    }
    Some(Form::Objects {
        verb,
        file: file?,
        namespace,
    })
}

/// kubectl's answer to `args` (with `stdin` as its standard input), made in-process; `None`
/// when the form is not one this module answers: run kubectl.
pub fn in_process(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Option<Output> {
    match form(args)? {
        Form::CreateNamespace(name) => {
            let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name}});
            Some(run(kubeconfig, Verb::Create, vec![ns], None, "namespace"))
        }
        Form::Objects {
            verb,
            file,
            namespace,
        } => {
            let (text, label) = if file == "-" {
                (stdin?.to_owned(), "STDIN")
            } else {
                (std::fs::read_to_string(file).ok()?, file)
            };
            let docs = documents(&text)?;
            // kubectl refuses an object whose namespace is not the one asked for: its words.
            if let Some(ns) = namespace
                && docs
                    .iter()
                    .any(|d| d["metadata"]["namespace"].as_str().is_some_and(|n| n != ns))
            {
                return None;
            }
            if verb == Verb::Apply
                && docs
                    .iter()
                    .any(|d| d["metadata"]["name"].as_str().is_none())
            {
                return None;
            }
            Some(run(kubeconfig, verb, docs, namespace, label))
        }
    }
}

/// The objects of a file as kubectl reads them (JSON, or YAML documents); `None` when it does
/// not parse, for kubectl to say why.
fn documents(text: &str) -> Option<Vec<Value>> {
    let docs: Vec<Value> = match serde_json::from_str::<Value>(text) {
        Ok(v) => vec![v],
        Err(_) => serde_saphyr::from_multiple::<Value>(text).ok()?,
    };
    let docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    (!docs.is_empty() && docs.iter().all(Value::is_object)).then_some(docs)
}

/// Each object created or applied in order; what each came to, as kubectl prints it.
fn run(kubeconfig: &Path, verb: Verb, docs: Vec<Value>, ns: Option<&str>, label: &str) -> Output {
    let client = match client(kubeconfig) {
        Ok(c) => c,
        Err(e) => return output(1, String::new(), format!("error: {e:#}\n")),
    };
    let (ns, label) = (ns.unwrap_or("default").to_owned(), label.to_owned());
    block(async move {
        let objects = match flattened(&docs) {
            Ok(o) => o,
            Err(e) => return output(1, String::new(), format!("error: {e:#}\n")),
        };
        let (mut stdout, mut stderr, mut code) = (String::new(), String::new(), 0);
        let mut kinds = Kinds::new();
        for mut obj in objects {
            let (api, scope) = match api_in(&client, &mut kinds, &obj, &ns).await {
                Ok(found) => found,
                Err(e) => {
                    stderr.push_str(&format!("error: resource mapping not found: {e:#}\n"));
                    code = 1;
                    continue;
                }
            };
            if scope == Scope::Namespaced && obj.metadata.namespace.is_none() {
                obj.metadata.namespace = Some(ns.clone());
            }
            let what = resource_of(&obj);
            match one(&api, verb, &obj).await {
                Ok((name, outcome)) => stdout.push_str(&format!("{what}/{name} {outcome}\n")),
                Err(kube::Error::Api(s)) => {
                    code = 1;
                    let verbing = if verb == Verb::Create {
                        "creating"
                    } else {
                        "applying"
                    };
                    stderr.push_str(&format!(
                        "Error from server ({}): error when {verbing} \"{label}\": {}\n",
                        s.reason, s.message
                    ));
                }
                Err(e) => {
                    code = 1;
                    stderr.push_str(&format!("error: {e}\n"));
                }
            }
        }
        output(code, stdout, stderr)
    })
}

/// Creates or applies `obj`: its name, and `created`, `configured` or `unchanged`.
async fn one(
    api: &Api<DynamicObject>,
    verb: Verb,
    obj: &DynamicObject,
) -> kube::Result<(String, &'static str)> {
    match verb {
        Verb::Create => {
            let pp = PostParams {
                field_manager: Some("kubectl-create".into()),
                ..PostParams::default()
            };
            let mut req = kube::core::Request::new(api.resource_url())
                .create(
                    &pp,
                    serde_json::to_vec(obj).map_err(kube::Error::SerdeError)?,
                )
                .map_err(kube::Error::BuildRequest)?;
            *req.uri_mut() = format!("{}&fieldValidation=Strict", req.uri())
                .parse()
                .expect("a create URL with a query takes one more parameter");
            let made: DynamicObject = api.clone().into_client().request(req).await?;
            Ok((made.metadata.name.unwrap_or_default(), "created"))
        }
        Verb::Apply => {
            let name = obj.metadata.name.clone().unwrap_or_default();
            let before = api.get_opt(&name).await?;
            let mut pp = PatchParams::apply("kubectl").validation(ValidationDirective::Strict);
            pp.force = true;
            let after = api.patch(&name, &pp, &Patch::Apply(obj)).await?;
            let outcome = match before {
                None => "created",
                Some(b) if b.metadata.resource_version == after.metadata.resource_version => {
                    "unchanged"
                }
                Some(_) => "configured",
            };
            Ok((name, outcome))
        }
    }
}

/// `configmap`, `clusterrole.rbac.authorization.k8s.io`: how kubectl names an object's kind.
fn resource_of(obj: &DynamicObject) -> String {
    let Some(types) = &obj.types else {
        return "object".into();
    };
    let kind = types.kind.to_lowercase();
    match types.api_version.split_once('/') {
        Some((group, _)) => format!("{kind}.{group}"),
        None => kind,
    }
}

fn output(code: i32, stdout: String, stderr: String) -> Output {
    Output {
        status: ExitStatus::from_raw(code << 8),
        stdout: stdout.into_bytes(),
        stderr: stderr.into_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forms_answered_in_process_and_the_rest_left_to_kubectl() {
        assert_eq!(
            form(&["create", "namespace", "a"]),
            Some(Form::CreateNamespace("a"))
        );
        assert_eq!(
            form(&["apply", "-f", "-", "-n", "x"]),
            Some(Form::Objects {
                verb: Verb::Apply,
                file: "-",
                namespace: Some("x")
            })
        );
        assert_eq!(
            form(&["create", "-f", "/p.yaml"]),
            Some(Form::Objects {
                verb: Verb::Create,
                file: "/p.yaml",
                namespace: None
            })
        );
        for kubectl in [
            &["create", "namespace", "a", "--dry-run=client"][..],
            &["create", "-f", "-", "-o", "jsonpath={.status.allowed}"],
            &["apply", "--server-side", "-f", "-"],
            &["apply", "-f", "-", "--as", "someone"],
            &["apply", "-f"],
            &["apply", "-n", "x"],
            &["create", "configmap", "c"],
            &["get", "pods"],
        ] {
            assert_eq!(form(kubectl), None, "{kubectl:?}");
        }
    }

    #[test]
    fn files_read_as_kubectl_reads_them() {
        assert_eq!(
            documents("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n")
                .map(|d| d.len()),
            Some(2)
        );
        assert_eq!(
            documents(r#"{"apiVersion": "v1", "kind": "List", "items": []}"#).map(|d| d.len()),
            Some(1)
        );
        assert_eq!(documents("just words"), None);
        assert_eq!(documents(""), None);
    }

    #[test]
    fn kinds_named_as_kubectl_names_them() {
        let obj = |api_version: &str, kind: &str| -> DynamicObject {
            serde_json::from_value(serde_json::json!({"apiVersion": api_version, "kind": kind,
                "metadata": {"name": "x"}}))
            .unwrap()
        };
        assert_eq!(resource_of(&obj("v1", "ConfigMap")), "configmap");
        assert_eq!(
            resource_of(&obj("rbac.authorization.k8s.io/v1", "ClusterRole")),
            "clusterrole.rbac.authorization.k8s.io"
        );
    }
}
