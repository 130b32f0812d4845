//! Node traits (API 1.37): `GET|PUT|DELETE /v1/nodes/{node}/traits` lists, replaces or clears
//! them, `PUT|DELETE /v1/nodes/{node}/traits/{trait}` adds or removes one. Names are checked as
//! Ironic's `TRAITS_SCHEMA` checks them (a standard os-traits name or `CUSTOM_[A-Z0-9_]+`, at
//! most 255 characters), at most 50 per node; below 1.37 the paths answer as Ironic's do.

use super::{extras_message, json_body, py_repr, py_str, refuse_locked, schema_error};
use crate::api::render::base_url;
use crate::api::{ApiError, ApiResult, AppState};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rivet_model::node::Node;
use rivet_store::NodeExt;
use rivet_store::StoreError;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// Ironic's limit (`MAX_TRAITS_PER_NODE`).
const MAX_TRAITS: usize = 50;

/// Custom trait names (`os_traits.CUSTOM_NAMESPACE`).
const CUSTOM_TRAIT_PATTERN: &str = "^CUSTOM_[A-Z0-9_]+$";

/// The standard trait names of os-traits 3.9.0 (`os_traits.get_traits()`), sorted.
const STANDARD_TRAITS: &str = "
COMPUTE_ACCELERATORS COMPUTE_ADDRESS_SPACE_EMULATED COMPUTE_ADDRESS_SPACE_PASSTHROUGH
COMPUTE_ARCH_AARCH64 COMPUTE_ARCH_MIPSEL COMPUTE_ARCH_PPC64LE COMPUTE_ARCH_RISCV64
COMPUTE_ARCH_S390X COMPUTE_ARCH_X86_64 COMPUTE_CONFIG_DRIVE_REGENERATION
COMPUTE_DEVICE_TAGGING COMPUTE_EPHEMERAL_ENCRYPTION COMPUTE_EPHEMERAL_ENCRYPTION_LUKS
COMPUTE_EPHEMERAL_ENCRYPTION_LUKSV2 COMPUTE_EPHEMERAL_ENCRYPTION_PLAIN COMPUTE_FIRMWARE_BIOS
COMPUTE_FIRMWARE_UEFI COMPUTE_GRAPHICS_MODEL_BOCHS COMPUTE_GRAPHICS_MODEL_CIRRUS
COMPUTE_GRAPHICS_MODEL_GOP COMPUTE_GRAPHICS_MODEL_NONE COMPUTE_GRAPHICS_MODEL_QXL
COMPUTE_GRAPHICS_MODEL_VGA COMPUTE_GRAPHICS_MODEL_VIRTIO COMPUTE_GRAPHICS_MODEL_VMVGA
COMPUTE_GRAPHICS_MODEL_XEN COMPUTE_IMAGE_TYPE_AKI COMPUTE_IMAGE_TYPE_AMI
COMPUTE_IMAGE_TYPE_ARI COMPUTE_IMAGE_TYPE_ISO COMPUTE_IMAGE_TYPE_PLOOP
COMPUTE_IMAGE_TYPE_QCOW2 COMPUTE_IMAGE_TYPE_RAW COMPUTE_IMAGE_TYPE_VDI
COMPUTE_IMAGE_TYPE_VHD COMPUTE_IMAGE_TYPE_VHDX COMPUTE_IMAGE_TYPE_VMDK
COMPUTE_MANAGED_PCI_DEVICE COMPUTE_MEM_BACKING_FILE COMPUTE_MIGRATE_AUTO_CONVERGE
COMPUTE_MIGRATE_POST_COPY COMPUTE_NET_ATTACH_INTERFACE COMPUTE_NET_ATTACH_INTERFACE_WITH_TAG
COMPUTE_NET_VIF_MODEL_E1000 COMPUTE_NET_VIF_MODEL_E1000E COMPUTE_NET_VIF_MODEL_IGB
COMPUTE_NET_VIF_MODEL_LAN9118 COMPUTE_NET_VIF_MODEL_NE2K_PCI COMPUTE_NET_VIF_MODEL_NETFRONT
COMPUTE_NET_VIF_MODEL_PCNET COMPUTE_NET_VIF_MODEL_RTL8139 COMPUTE_NET_VIF_MODEL_SPAPR_VLAN
COMPUTE_NET_VIF_MODEL_SRIOV COMPUTE_NET_VIF_MODEL_VIRTIO COMPUTE_NET_VIF_MODEL_VMXNET
COMPUTE_NET_VIF_MODEL_VMXNET3 COMPUTE_NET_VIRTIO_PACKED COMPUTE_NODE
COMPUTE_REMOTE_MANAGED_PORTS COMPUTE_RESCUE_BFV COMPUTE_SAME_HOST_COLD_MIGRATE
COMPUTE_SECURITY_STATELESS_FIRMWARE COMPUTE_SECURITY_TPM_1_2 COMPUTE_SECURITY_TPM_2_0
COMPUTE_SECURITY_TPM_CRB COMPUTE_SECURITY_TPM_SECRET_SECURITY_DEPLOYMENT
COMPUTE_SECURITY_TPM_SECRET_SECURITY_HOST COMPUTE_SECURITY_TPM_SECRET_SECURITY_USER
COMPUTE_SECURITY_TPM_TIS COMPUTE_SECURITY_UEFI_SECURE_BOOT COMPUTE_SHARE_LOCAL_FS
COMPUTE_SOCKET_PCI_NUMA_AFFINITY COMPUTE_SOUND_MODEL_AC97 COMPUTE_SOUND_MODEL_ES1370
COMPUTE_SOUND_MODEL_ICH6 COMPUTE_SOUND_MODEL_ICH9 COMPUTE_SOUND_MODEL_PCSPK
COMPUTE_SOUND_MODEL_SB16 COMPUTE_SOUND_MODEL_USB COMPUTE_SOUND_MODEL_VIRTIO
COMPUTE_STATUS_DISABLED COMPUTE_STORAGE_BUS_FDC COMPUTE_STORAGE_BUS_IDE
COMPUTE_STORAGE_BUS_LXC COMPUTE_STORAGE_BUS_SATA COMPUTE_STORAGE_BUS_SCSI
COMPUTE_STORAGE_BUS_UML COMPUTE_STORAGE_BUS_USB COMPUTE_STORAGE_BUS_VIRTIO
COMPUTE_STORAGE_BUS_XEN COMPUTE_STORAGE_VIRTIO_FS COMPUTE_TRUSTED_CERTS
COMPUTE_USB_MODEL_NEC_XHCI COMPUTE_USB_MODEL_QEMU_XHCI COMPUTE_VIOMMU_MODEL_AUTO
COMPUTE_VIOMMU_MODEL_INTEL COMPUTE_VIOMMU_MODEL_SMMUV3 COMPUTE_VIOMMU_MODEL_VIRTIO
COMPUTE_VOLUME_ATTACH COMPUTE_VOLUME_ATTACH_WITH_TAG COMPUTE_VOLUME_EXTEND
COMPUTE_VOLUME_MULTI_ATTACH HW_ARCH_AARCH64 HW_ARCH_ALPHA HW_ARCH_ARMV6 HW_ARCH_ARMV7
HW_ARCH_ARMV7B HW_ARCH_CRIS HW_ARCH_I686 HW_ARCH_IA64 HW_ARCH_LM32 HW_ARCH_M68K
HW_ARCH_MICROBLAZE HW_ARCH_MICROBLAZEEL HW_ARCH_MIPS HW_ARCH_MIPS64 HW_ARCH_MIPS64EL
HW_ARCH_MIPSEL HW_ARCH_OPENRISC HW_ARCH_PARISC HW_ARCH_PARISC64 HW_ARCH_PPC HW_ARCH_PPC64
HW_ARCH_PPC64LE HW_ARCH_PPCEMB HW_ARCH_PPCLE HW_ARCH_S390 HW_ARCH_S390X HW_ARCH_SH4
HW_ARCH_SH4EB HW_ARCH_SPARC HW_ARCH_SPARC64 HW_ARCH_UNICORE32 HW_ARCH_X86_64 HW_ARCH_XTENSA
HW_ARCH_XTENSAEB HW_CPU_AARCH64_AES HW_CPU_AARCH64_ASIMD HW_CPU_AARCH64_ASIMDDP
HW_CPU_AARCH64_ASIMDHP HW_CPU_AARCH64_ASIMDRDM HW_CPU_AARCH64_ATOMICS HW_CPU_AARCH64_CPUID
HW_CPU_AARCH64_CRC32 HW_CPU_AARCH64_DCPOP HW_CPU_AARCH64_EVTSTRM HW_CPU_AARCH64_FCMA
HW_CPU_AARCH64_FP HW_CPU_AARCH64_FPHP HW_CPU_AARCH64_JSCVT HW_CPU_AARCH64_LRCPC
HW_CPU_AARCH64_PMULL HW_CPU_AARCH64_SHA1 HW_CPU_AARCH64_SHA2 HW_CPU_AARCH64_SHA3
HW_CPU_AARCH64_SHA512 HW_CPU_AARCH64_SM3 HW_CPU_AARCH64_SM4 HW_CPU_AARCH64_SVE
HW_CPU_AMD_SEV HW_CPU_HYPERTHREADING HW_CPU_PPC64LE_POWER8 HW_CPU_PPC64LE_POWER9
HW_CPU_X86_3DNOW HW_CPU_X86_ABM HW_CPU_X86_AESNI HW_CPU_X86_AMD_IBPB HW_CPU_X86_AMD_NO_SSB
HW_CPU_X86_AMD_SEV HW_CPU_X86_AMD_SEV_ES HW_CPU_X86_AMD_SEV_SNP HW_CPU_X86_AMD_SSBD
HW_CPU_X86_AMD_SVM HW_CPU_X86_AMD_VIRT_SSBD HW_CPU_X86_AMXBF16 HW_CPU_X86_AMXINT8
HW_CPU_X86_AMXTILE HW_CPU_X86_ASF HW_CPU_X86_AVX HW_CPU_X86_AVX2 HW_CPU_X86_AVX512BITALG
HW_CPU_X86_AVX512BW HW_CPU_X86_AVX512CD HW_CPU_X86_AVX512DQ HW_CPU_X86_AVX512ER
HW_CPU_X86_AVX512F HW_CPU_X86_AVX512GFNI HW_CPU_X86_AVX512IFMA HW_CPU_X86_AVX512PF
HW_CPU_X86_AVX512VAES HW_CPU_X86_AVX512VBMI HW_CPU_X86_AVX512VBMI2 HW_CPU_X86_AVX512VL
HW_CPU_X86_AVX512VNNI HW_CPU_X86_AVX512VPCLMULQDQ HW_CPU_X86_AVX512VPOPCNTDQ HW_CPU_X86_BMI
HW_CPU_X86_BMI2 HW_CPU_X86_CLMUL HW_CPU_X86_F16C HW_CPU_X86_FMA3 HW_CPU_X86_FMA4
HW_CPU_X86_INTEL_MD_CLEAR HW_CPU_X86_INTEL_PCID HW_CPU_X86_INTEL_SPEC_CTRL
HW_CPU_X86_INTEL_SSBD HW_CPU_X86_INTEL_TDX HW_CPU_X86_INTEL_VMX HW_CPU_X86_MMX
HW_CPU_X86_MPX HW_CPU_X86_PDPE1GB HW_CPU_X86_SGX HW_CPU_X86_SHA HW_CPU_X86_SSE
HW_CPU_X86_SSE2 HW_CPU_X86_SSE3 HW_CPU_X86_SSE41 HW_CPU_X86_SSE42 HW_CPU_X86_SSE4A
HW_CPU_X86_SSSE3 HW_CPU_X86_STIBP HW_CPU_X86_SVM HW_CPU_X86_TBM HW_CPU_X86_TSX
HW_CPU_X86_VMX HW_CPU_X86_XOP HW_GPU_API_DIRECT2D HW_GPU_API_DIRECT3D_V10_0
HW_GPU_API_DIRECT3D_V10_1 HW_GPU_API_DIRECT3D_V11_0 HW_GPU_API_DIRECT3D_V11_1
HW_GPU_API_DIRECT3D_V11_2 HW_GPU_API_DIRECT3D_V11_3 HW_GPU_API_DIRECT3D_V12_0
HW_GPU_API_DIRECT3D_V6_0 HW_GPU_API_DIRECT3D_V7_0 HW_GPU_API_DIRECT3D_V8_0
HW_GPU_API_DIRECT3D_V8_1 HW_GPU_API_DIRECT3D_V9_0 HW_GPU_API_DIRECT3D_V9_0B
HW_GPU_API_DIRECT3D_V9_0C HW_GPU_API_DIRECT3D_V9_0L HW_GPU_API_DIRECTX_V10
HW_GPU_API_DIRECTX_V11 HW_GPU_API_DIRECTX_V12 HW_GPU_API_DXVA HW_GPU_API_OPENCL_V1_0
HW_GPU_API_OPENCL_V1_1 HW_GPU_API_OPENCL_V1_2 HW_GPU_API_OPENCL_V2_0 HW_GPU_API_OPENCL_V2_1
HW_GPU_API_OPENCL_V2_2 HW_GPU_API_OPENGL_V1_1 HW_GPU_API_OPENGL_V1_2 HW_GPU_API_OPENGL_V1_3
HW_GPU_API_OPENGL_V1_4 HW_GPU_API_OPENGL_V1_5 HW_GPU_API_OPENGL_V2_0 HW_GPU_API_OPENGL_V2_1
HW_GPU_API_OPENGL_V3_0 HW_GPU_API_OPENGL_V3_1 HW_GPU_API_OPENGL_V3_2 HW_GPU_API_OPENGL_V3_3
HW_GPU_API_OPENGL_V4_0 HW_GPU_API_OPENGL_V4_1 HW_GPU_API_OPENGL_V4_2 HW_GPU_API_OPENGL_V4_3
HW_GPU_API_OPENGL_V4_4 HW_GPU_API_OPENGL_V4_5 HW_GPU_API_VULKAN
HW_GPU_CUDA_COMPUTE_CAPABILITY_V1_0 HW_GPU_CUDA_COMPUTE_CAPABILITY_V1_1
HW_GPU_CUDA_COMPUTE_CAPABILITY_V1_2 HW_GPU_CUDA_COMPUTE_CAPABILITY_V1_3
HW_GPU_CUDA_COMPUTE_CAPABILITY_V2_0 HW_GPU_CUDA_COMPUTE_CAPABILITY_V2_1
HW_GPU_CUDA_COMPUTE_CAPABILITY_V3_0 HW_GPU_CUDA_COMPUTE_CAPABILITY_V3_2
HW_GPU_CUDA_COMPUTE_CAPABILITY_V3_5 HW_GPU_CUDA_COMPUTE_CAPABILITY_V3_7
HW_GPU_CUDA_COMPUTE_CAPABILITY_V5_0 HW_GPU_CUDA_COMPUTE_CAPABILITY_V5_2
HW_GPU_CUDA_COMPUTE_CAPABILITY_V5_3 HW_GPU_CUDA_COMPUTE_CAPABILITY_V6_0
HW_GPU_CUDA_COMPUTE_CAPABILITY_V6_1 HW_GPU_CUDA_COMPUTE_CAPABILITY_V6_2
HW_GPU_CUDA_COMPUTE_CAPABILITY_V7_0 HW_GPU_CUDA_COMPUTE_CAPABILITY_V7_1
HW_GPU_CUDA_COMPUTE_CAPABILITY_V7_2 HW_GPU_CUDA_SDK_V10_0 HW_GPU_CUDA_SDK_V6_5
HW_GPU_CUDA_SDK_V7_5 HW_GPU_CUDA_SDK_V8_0 HW_GPU_CUDA_SDK_V9_0 HW_GPU_CUDA_SDK_V9_1
HW_GPU_CUDA_SDK_V9_2 HW_GPU_MAX_DISPLAY_HEADS_1 HW_GPU_MAX_DISPLAY_HEADS_2
HW_GPU_MAX_DISPLAY_HEADS_4 HW_GPU_MAX_DISPLAY_HEADS_6 HW_GPU_MAX_DISPLAY_HEADS_8
HW_GPU_RESOLUTION_W1024H600 HW_GPU_RESOLUTION_W1024H768 HW_GPU_RESOLUTION_W1152H864
HW_GPU_RESOLUTION_W1280H1024 HW_GPU_RESOLUTION_W1280H720 HW_GPU_RESOLUTION_W1280H768
HW_GPU_RESOLUTION_W1280H800 HW_GPU_RESOLUTION_W1360H768 HW_GPU_RESOLUTION_W1366H768
HW_GPU_RESOLUTION_W1440H900 HW_GPU_RESOLUTION_W1600H1200 HW_GPU_RESOLUTION_W1600H900
HW_GPU_RESOLUTION_W1680H1050 HW_GPU_RESOLUTION_W1920H1080 HW_GPU_RESOLUTION_W1920H1200
HW_GPU_RESOLUTION_W2560H1440 HW_GPU_RESOLUTION_W2560H1600 HW_GPU_RESOLUTION_W320H240
HW_GPU_RESOLUTION_W3840H2160 HW_GPU_RESOLUTION_W640H480 HW_GPU_RESOLUTION_W7680H4320
HW_GPU_RESOLUTION_W800H600 HW_NIC_ACCEL_DEFLATE HW_NIC_ACCEL_DIFFIEH HW_NIC_ACCEL_ECC
HW_NIC_ACCEL_IPSEC HW_NIC_ACCEL_LZS HW_NIC_ACCEL_RSA HW_NIC_ACCEL_SSL HW_NIC_ACCEL_TLS
HW_NIC_DCB_ETS HW_NIC_DCB_PFC HW_NIC_DCB_QCN HW_NIC_MULTIQUEUE HW_NIC_OFFLOAD_FDF
HW_NIC_OFFLOAD_GENEVE HW_NIC_OFFLOAD_GRE HW_NIC_OFFLOAD_GRO HW_NIC_OFFLOAD_GSO
HW_NIC_OFFLOAD_L2CRC HW_NIC_OFFLOAD_LRO HW_NIC_OFFLOAD_LSO HW_NIC_OFFLOAD_QINQ
HW_NIC_OFFLOAD_RDMA HW_NIC_OFFLOAD_RX HW_NIC_OFFLOAD_RXHASH HW_NIC_OFFLOAD_RXVLAN
HW_NIC_OFFLOAD_SCS HW_NIC_OFFLOAD_SG HW_NIC_OFFLOAD_SWITCHDEV HW_NIC_OFFLOAD_TCS
HW_NIC_OFFLOAD_TSO HW_NIC_OFFLOAD_TX HW_NIC_OFFLOAD_TXUDP HW_NIC_OFFLOAD_TXVLAN
HW_NIC_OFFLOAD_UCS HW_NIC_OFFLOAD_UFO HW_NIC_OFFLOAD_VXLAN HW_NIC_PROGRAMMABLE_PIPELINE
HW_NIC_SRIOV HW_NIC_SRIOV_MULTIQUEUE HW_NIC_SRIOV_QOS_RX HW_NIC_SRIOV_QOS_TX
HW_NIC_SRIOV_TRUSTED HW_NIC_VMDQ HW_NUMA_ROOT HW_NVME_BES HW_NVME_CES HW_NVME_WZS
HW_PCI_LIVE_MIGRATABLE HW_PCI_ONE_TIME_USE MISC_SHARES_VIA_AGGREGATE OWNER_CYBORG OWNER_NOVA
STORAGE_DISK_HDD STORAGE_DISK_SSD
";

fn is_custom_trait(t: &str) -> bool {
    t.strip_prefix("CUSTOM_").is_some_and(|rest| {
        !rest.is_empty()
            && rest
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    })
}

fn is_standard_trait(t: &str) -> bool {
    STANDARD_TRAITS.split_ascii_whitespace().any(|s| s == t)
}

/// What Ironic's `TRAITS_SCHEMA` says of a trait, or `None` when it is valid.
pub(crate) fn trait_error(v: &Value) -> Option<String> {
    let Some(t) = v.as_str() else {
        return Some(format!("{} is not of type 'string'", py_repr(v)));
    };
    if t.is_empty() {
        return Some(format!("{} should be non-empty", py_str(t)));
    }
    if t.chars().count() > 255 {
        return Some(format!("{} is too long", py_str(t)));
    }
    if is_custom_trait(t) || is_standard_trait(t) {
        return None;
    }
    let r = py_str(t);
    Some(format!(
        "{r} is not valid under any of the given schemas. Possible root cause: {r} does not match '{CUSTOM_TRAIT_PATTERN}'"
    ))
}

/// The body of a traits PUT checked as Ironic checks it (`{"traits": [...]}`, nothing
/// else); `None` for no body.
fn traits_body(body: &Bytes) -> Result<Option<Map<String, Value>>, ApiError> {
    let Some(v) = json_body(body)? else {
        return Ok(None);
    };
    let Value::Object(m) = v else {
        return Err(schema_error(
            "body",
            format!("{} is not of type 'object'", py_repr(&v)),
        ));
    };
    let extras: Vec<&String> = m.keys().filter(|k| *k != "traits").collect();
    if !extras.is_empty() {
        return Err(schema_error("body", extras_message(&extras)));
    }
    if let Some(t) = m.get("traits") {
        let Some(items) = t.as_array() else {
            return Err(schema_error(
                "body",
                format!("{} is not of type 'array'", py_repr(t)),
            ));
        };
        if let Some(e) = items.iter().find_map(trait_error) {
            return Err(schema_error("body", e));
        }
    }
    Ok(Some(m))
}

const ONE_OR_ALL: &str = "A single node trait may be added via PUT /v1/nodes/<node identifier>/traits/<trait> with no body, or all node traits may be replaced via PUT /v1/nodes/<node identifier>/traits with the list of traits specified in the request body.";

/// Change the node's traits with `change` and store them, sorted and without duplicates;
/// read again and retry when another write landed in between.
async fn write_traits(
    state: &AppState,
    ident: &str,
    change: impl Fn(&Node) -> Result<BTreeSet<String>, ApiError>,
) -> ApiResult<()> {
    let mut attempts = 0;
    loop {
        let mut node = state.conductor.store.get_node(ident).await?;
        node.writable()?;
        refuse_locked(&node, false)?;
        let traits: Vec<String> = change(&node)?.into_iter().collect();
        if traits.len() > MAX_TRAITS {
            return Err(ApiError::bad_request(format!(
                "Could not modify traits for node {} as it would exceed the maximum number of traits per node ({} vs. {MAX_TRAITS})",
                node.uuid,
                traits.len()
            )));
        }
        if traits == node.traits {
            return Ok(());
        }
        node.traits = traits;
        match state.conductor.update_node(&node).await {
            Ok(saved) => {
                tracing::info!(node = %saved.uuid, traits = ?saved.traits, "node traits changed");
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) if attempts < 3 => attempts += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

pub(super) async fn traits_list(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    Ok(Json(json!({ "traits": node.traits })))
}

/// `PUT /v1/nodes/{node}/traits` `{"traits": [...]}`: replace them all (204).
pub(super) async fn traits_set(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let body = traits_body(&body)?;
    state.conductor.store.get_node(&ident).await?;
    let Some(Value::Array(items)) = body.as_ref().and_then(|b| b.get("traits")) else {
        return Err(ApiError::bad_request(ONE_OR_ALL));
    };
    let wanted: BTreeSet<String> = items
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    write_traits(&state, &ident, |_| Ok(wanted.clone())).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `PUT /v1/nodes/{node}/traits/{trait}`: add one (204, its URL in Location).
pub(super) async fn trait_add(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((ident, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Response> {
    if let Some(e) = trait_error(&Value::from(name.as_str())) {
        return Err(schema_error("trait", e));
    }
    let body = traits_body(&body)?;
    state.conductor.store.get_node(&ident).await?;
    if body.is_some_and(|b| b.contains_key("traits")) {
        return Err(ApiError::bad_request(ONE_OR_ALL));
    }
    write_traits(&state, &ident, |node| {
        let mut t: BTreeSet<String> = node.traits.iter().cloned().collect();
        t.insert(name.clone());
        Ok(t)
    })
    .await?;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let location = format!(
        "{}/v1/nodes/{}/traits/{}",
        base_url(&headers),
        url_segment(&ident),
        url_segment(&name)
    );
    if let Ok(v) = HeaderValue::from_str(&location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

/// Percent-encode one path segment.
fn url_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `DELETE /v1/nodes/{node}/traits/{trait}`: 204, or 404 when the node does not have it.
pub(super) async fn trait_remove(
    State(state): State<AppState>,
    Path((ident, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    write_traits(&state, &ident, |node| {
        if !node.traits.contains(&name) {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("Node {} doesn't have a trait '{name}'", node.uuid),
            ));
        }
        Ok(node
            .traits
            .iter()
            .filter(|t| **t != name)
            .cloned()
            .collect())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/nodes/{node}/traits`: remove them all (204).
pub(super) async fn traits_clear(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<StatusCode> {
    write_traits(&state, &ident, |_| Ok(BTreeSet::new())).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn standard_traits_are_sorted_unique_and_well_formed() {
        let all: Vec<&str> = STANDARD_TRAITS.split_ascii_whitespace().collect();
        assert_eq!(all.len(), 377);
        assert!(all.windows(2).all(|w| w[0] < w[1]));
        assert!(all.iter().all(|t| t
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')));
        assert!(is_standard_trait("HW_CPU_X86_VMX"));
        assert!(!is_standard_trait("HW_CPU_X86"));
    }

    #[test]
    fn trait_names_as_ironic_checks_them() {
        let e = |v: Value| trait_error(&v);
        assert_eq!(e(json!("CUSTOM_RAID_1")), None);
        assert_eq!(e(json!("HW_CPU_X86_AVX2")), None);
        assert_eq!(
            e(json!("bad_trait")).unwrap(),
            "'bad_trait' is not valid under any of the given schemas. Possible root cause: 'bad_trait' does not match '^CUSTOM_[A-Z0-9_]+$'"
        );
        assert!(e(json!("CUSTOM_")).is_some());
        assert!(e(json!("CUSTOM_lower")).is_some());
        let long = format!("CUSTOM_{}", "T".repeat(249));
        assert_eq!(e(json!(long)).unwrap(), format!("'{long}' is too long"));
        assert_eq!(e(json!("CUSTOM_".to_string() + &"T".repeat(248))), None);
        assert_eq!(e(json!("")).unwrap(), "'' should be non-empty");
        assert_eq!(e(json!(5)).unwrap(), "5 is not of type 'string'");
    }

    #[test]
    fn traits_bodies() {
        let b = |s: &str| traits_body(&Bytes::from(s.to_string()));
        assert!(b("").unwrap().is_none());
        assert!(b("null").unwrap().is_none());
        assert_eq!(b("{}").unwrap().unwrap().len(), 0);
        let msg = |s: &str| b(s).unwrap_err().message;
        assert_eq!(
            msg(r#"{"trait": "CUSTOM_3"}"#),
            "Schema error for body: Additional properties are not allowed ('trait' was unexpected)"
        );
        assert_eq!(
            msg(r#"{"traits": "CUSTOM_3"}"#),
            "Schema error for body: 'CUSTOM_3' is not of type 'array'"
        );
        assert!(msg(r#"{"traits": ["CUSTOM_3", "BAD_TRAIT"]}"#)
            .starts_with("Schema error for body: 'BAD_TRAIT' is not valid"));
        assert_eq!(
            msg("[]"),
            "Schema error for body: [] is not of type 'object'"
        );
    }
}
