//! Node sub-resources Ironic's clients call in everyday flows, with the shapes, codes and
//! microversion gates of Ironic's `node.py` and its unit tests:
//!
//! - traits (1.37): `GET|PUT|DELETE /v1/nodes/{node}/traits`, `PUT|DELETE …/traits/{trait}`;
//!   standard os-traits names or `CUSTOM_[A-Z0-9_]+`, at most 255 characters, 50 per node;
//! - `GET /v1/nodes/{node}/validate`: `{"result": bool, "reason": …}` per interface;
//! - the boot device: `GET|PUT …/management/boot_device`, `GET …/boot_device/supported`;
//! - virtual media: `POST|DELETE /v1/nodes/{node}/vmedia` (1.89), `GET` (1.93).
//!
//! Whatever changes the node or talks to its BMC is refused with 409 while another operation
//! holds the node (its reservation; for BMC calls also a power action in flight), as Ironic
//! refuses a node locked by another task. Reads Ironic serves under a shared lock (traits,
//! validate, supported devices, the vmedia list) are not refused. A record that does not
//! decode is never acted on (409, as for every write of it).

use super::render::base_url;
use super::{ApiError, ApiResult, ApiVersion, AppState};
use crate::conductor::ConductorError;
use crate::drivers::{Bmc, BootDevice, DriverError};
use crate::interfaces::Iface;
use crate::store::{Node, PortQuery, StoreError};
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, put};
use axum::{Extension, Json, Router};
use rivet_protocol::limits::{parse_strict, Limits};
use serde_json::{json, Map, Value};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/nodes/{ident}/traits",
            get(traits_list).put(traits_set).delete(traits_clear),
        )
        .route(
            "/v1/nodes/{ident}/traits/{trait}",
            put(trait_add).delete(trait_remove),
        )
        .route("/v1/nodes/{ident}/validate", get(validate))
        .route(
            "/v1/nodes/{ident}/management/boot_device",
            get(boot_device_get).put(boot_device_set),
        )
        .route(
            "/v1/nodes/{ident}/management/boot_device/supported",
            get(boot_device_supported),
        )
        .route(
            "/v1/nodes/{ident}/vmedia",
            get(vmedia_get).post(vmedia_attach).delete(vmedia_detach),
        )
        .route(
            "/v1/nodes/{ident}/vmedia/{device_type}",
            delete(vmedia_detach_one),
        )
}

// ------------------------------------------------------------------ versions and refusals

/// Node traits (`MINOR_37_NODE_TRAITS`).
const TRAITS_VERSION: (u32, u32) = (1, 37);
/// Attaching and detaching virtual media (`MINOR_89_ATTACH_DETACH_VMEDIA`).
const VMEDIA_VERSION: (u32, u32) = (1, 89);
/// Listing virtual media (`MINOR_93_GET_VMEDIA`).
const VMEDIA_GET_VERSION: (u32, u32) = (1, 93);

fn ver(v: (u32, u32)) -> String {
    format!("{}.{}", v.0, v.1)
}

/// Below 1.37 Ironic routes these paths elsewhere, and its tests pin what that gives: a GET
/// reads as a node request for the field `traits`, newer than the version (406); a PUT finds
/// no handler (405); a DELETE no resource (404).
fn traits_gate(version: (u32, u32), method: &Method) -> Result<(), ApiError> {
    if version >= TRAITS_VERSION {
        return Ok(());
    }
    let status = match *method {
        Method::GET => StatusCode::NOT_ACCEPTABLE,
        Method::PUT => StatusCode::METHOD_NOT_ALLOWED,
        _ => StatusCode::NOT_FOUND,
    };
    Err(ApiError::new(
        status,
        format!(
            "node traits need API version {} or later; this request asked for {}",
            ver(TRAITS_VERSION),
            ver(version)
        ),
    ))
}

/// Virtual media is 404 below its version, as in Ironic.
fn vmedia_gate(version: (u32, u32), need: (u32, u32), ident: &str) -> Result<(), ApiError> {
    if version >= need {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::NOT_FOUND,
        format!(
            "the resource /v1/nodes/{ident}/vmedia is not served at API version {}: this request needs {} or later",
            ver(version),
            ver(need)
        ),
    ))
}

/// 409 while another operation holds the node: its reservation (a provision operation, the
/// conductor's lease) and, with `power_too`, a power action still running (Ironic's power
/// action holds the node's lock as long).
fn refuse_locked(node: &Node, power_too: bool) -> Result<(), ApiError> {
    if let Some(by) = &node.reservation {
        return Err(ConductorError::Locked {
            node: node.ident().to_string(),
            by: by.clone(),
            state: node.provision_state,
        }
        .into());
    }
    if let (true, Some(t)) = (power_too, node.target_power_state) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "node {} has a power action in progress (target \"{t}\"); retry when it ends",
                node.ident()
            ),
        ));
    }
    Ok(())
}

/// A driver failure as Ironic answers it: an operation the driver lacks or bad driver_info
/// is the caller's to fix (400); a BMC that fails is a server-side failure (500).
fn driver_error(node: &Node, e: DriverError) -> ApiError {
    match e {
        DriverError::Unsupported { operation, .. } => ApiError::bad_request(format!(
            "Driver {} does not support {operation} (disabled or not implemented).",
            node.driver
        )),
        e @ (DriverError::BadDriverInfo { .. } | DriverError::BadStepArgs { .. }) => {
            ApiError::bad_request(format!("node {}: {e}", node.ident()))
        }
        e @ DriverError::Bmc(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("node {}: {e}", node.ident()),
        ),
    }
}

/// The node to act on through its BMC: readable, not held by another operation, its driver
/// and driver_info usable (Ironic validates the management interface first).
async fn node_for_bmc(
    state: &AppState,
    ident: &str,
    exclusive: bool,
) -> Result<(Node, Arc<dyn Bmc>), ApiError> {
    let node = state.conductor.store.get_node(ident).await?;
    node.writable()?;
    if exclusive {
        refuse_locked(&node, true)?;
    }
    let bmc = state.conductor.bmc(&node)?;
    bmc.validate(&node.driver_info)
        .map_err(|e| driver_error(&node, e))?;
    Ok((node, bmc))
}

/// A request body as JSON under the admin limits; `None` when empty or `null`.
fn json_body(body: &Bytes) -> Result<Option<Value>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let v: Value =
        parse_strict(body, &Limits::ADMIN).map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(if v.is_null() { None } else { Some(v) })
}

// ------------------------------------------------------------------ Ironic's schema errors

/// A string as Python's `repr` writes it (Ironic's schema errors quote values that way).
fn py_str(s: &str) -> String {
    let q = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(q);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == q => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push(q);
    out
}

/// A JSON value as Python's `repr` of its decoded form.
fn py_repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => py_str(s),
        Value::Array(a) => format!("[{}]", a.iter().map(py_repr).collect::<Vec<_>>().join(", ")),
        Value::Object(m) => format!(
            "{{{}}}",
            m.iter()
                .map(|(k, v)| format!("{}: {}", py_str(k), py_repr(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn schema_error(name: &str, message: String) -> ApiError {
    ApiError::bad_request(format!("Schema error for {name}: {message}"))
}

/// jsonschema's message for properties a schema does not allow.
fn extras_message(extras: &[&String]) -> String {
    let mut names: Vec<String> = extras.iter().map(|k| py_str(k)).collect();
    names.sort();
    let verb = if names.len() == 1 { "was" } else { "were" };
    format!(
        "Additional properties are not allowed ({} {verb} unexpected)",
        names.join(", ")
    )
}

// ------------------------------------------------------------------ traits

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
fn trait_error(v: &Value) -> Option<String> {
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
        match state.conductor.store.update_node(&node).await {
            Ok(saved) => {
                tracing::info!(node = %saved.uuid, traits = ?saved.traits, "node traits changed");
                return Ok(());
            }
            Err(StoreError::Conflict { .. }) if attempts < 3 => attempts += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

async fn traits_list(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    traits_gate(version, &Method::GET)?;
    let node = state.conductor.store.get_node(&ident).await?;
    Ok(Json(json!({ "traits": node.traits })))
}

/// `PUT /v1/nodes/{node}/traits` `{"traits": [...]}`: replace them all (204).
async fn traits_set(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    traits_gate(version, &Method::PUT)?;
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
async fn trait_add(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    headers: HeaderMap,
    Path((ident, name)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<Response> {
    traits_gate(version, &Method::PUT)?;
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
async fn trait_remove(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path((ident, name)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    traits_gate(version, &Method::DELETE)?;
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
async fn traits_clear(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(ident): Path<String>,
) -> ApiResult<StatusCode> {
    traits_gate(version, &Method::DELETE)?;
    write_traits(&state, &ident, |_| Ok(BTreeSet::new())).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------------ validate

/// One interface's verdict: `Ok` shows `{"result": true}`, `Err` `{"result": false,
/// "reason": …}` (Ironic's conductor gives a reason only with a failure).
type Verdict = Result<(), String>;

fn verdict(v: &Verdict) -> Value {
    match v {
        Ok(()) => json!({ "result": true }),
        Err(reason) => json!({ "result": false, "reason": reason }),
    }
}

/// `GET /v1/nodes/{node}/validate`: every interface but vendor, as Ironic's
/// `validate_driver_interfaces` reports them at every microversion.
async fn validate(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    node.writable()?;
    let bmc = state.conductor.bmc(&node).map_err(|e| e.to_string());
    let driver_info: Verdict = match &bmc {
        Ok(b) => b.validate(&node.driver_info).map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    };
    let unsupported = |iface: &str| -> Verdict {
        Err(format!(
            "Driver {} does not support {iface} (disabled or not implemented).",
            node.driver
        ))
    };
    // The rest of an interface: `no-*` fails, `noop`/`fake` pass, the driver's own
    // implementation (redfish, ipmitool) needs its driver_info.
    let generic = |iface: &str, value: &str| -> Verdict {
        match value {
            v if v.starts_with("no-") => unsupported(iface),
            "noop" | "fake" => Ok(()),
            _ => driver_info.clone(),
        }
    };
    let get = |i: Iface| node.interfaces.get(&node.driver, i);
    let boot = boot_verdict(&state, &node, &driver_info).await;
    let deploy = match get(Iface::Deploy).as_str() {
        "fake" => Ok(()),
        // The agent's deploy boots the ramdisk through the boot interface first.
        "direct" => boot.clone().and_then(|()| image_verdict(&node)),
        _ => unsupported("deploy"),
    };
    let inspect_iface = node.inspect_interface.as_deref().unwrap_or("agent");
    let inspect = match inspect_iface {
        "agent" => boot.clone(),
        "redfish" if node.driver != "redfish" => unsupported("out-of-band inspection"),
        v => generic("inspect", v),
    };
    let mut out = Map::new();
    out.insert("boot".into(), verdict(&boot));
    out.insert("deploy".into(), verdict(&deploy));
    out.insert("management".into(), verdict(&driver_info));
    out.insert(
        "network".into(),
        verdict(&generic("network", &get(Iface::Network))),
    );
    out.insert("power".into(), verdict(&driver_info));
    for iface in [
        Iface::Bios,
        Iface::Console,
        Iface::Firmware,
        Iface::Raid,
        Iface::Rescue,
        Iface::Storage,
    ] {
        out.insert(
            iface.as_str().into(),
            verdict(&generic(iface.as_str(), &get(iface))),
        );
    }
    out.insert("inspect".into(), verdict(&inspect));
    Ok(Json(Value::Object(out)))
}

/// Whether the boot interface has what it needs to boot the ramdisk.
async fn boot_verdict(state: &AppState, node: &Node, driver_info: &Verdict) -> Verdict {
    let boot = &state.conductor.config.boot;
    match node.interfaces.get(&node.driver, Iface::Boot).as_str() {
        "fake" => Ok(()),
        "ipxe" | "pxe" => {
            let ports = state
                .conductor
                .store
                .list_ports(&PortQuery {
                    node_uuid: Some(node.uuid.clone()),
                    ..Default::default()
                })
                .await
                .map_err(|e| e.to_string())?;
            if !ports.iter().any(|p| p.pxe_enabled) {
                return Err(format!(
                    "Node {} does not have any port associated with it",
                    node.uuid
                ));
            }
            let dir = boot.artefact_dir.as_deref().ok_or_else(|| {
                "rivetd has no [boot] artefact_dir, so it has no kernel and ramdisk to network-boot; set it to image-build's output directory".to_string()
            })?;
            for file in ["vmlinuz", "rivet.initramfs"] {
                let path = dir.join(file);
                // One stat per file: cheap enough for the async thread.
                std::fs::metadata(&path).map_err(|e| {
                    format!("cannot read the boot artefact {}: {e}", path.display())
                })?;
            }
            Ok(())
        }
        crate::conductor::boot::VIRTUAL_MEDIA => {
            driver_info.clone()?;
            let (boot, uuid) = (boot.clone(), node.uuid.clone());
            // Reads the ISO the first time (tens of MiB): off the async threads.
            tokio::task::spawn_blocking(move || crate::bootiso::check(&boot, &uuid))
                .await
                .map_err(|e| e.to_string())?
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        _ => Err(format!(
            "Driver {} does not support boot (disabled or not implemented).",
            node.driver
        )),
    }
}

/// The image fields a `direct` deploy needs — the conductor's own check, so validate and
/// deploy can never disagree — and the root device hints. A missing image_source is told in
/// Ironic's words, which clients and operators grep for.
fn image_verdict(node: &Node) -> Verdict {
    let missing = node
        .instance_info
        .get("image_source")
        .and_then(Value::as_str)
        .is_none_or(|v| v.trim().is_empty());
    if missing {
        return Err(format!(
            "Node {} failed to validate deploy image info. Some parameters were missing. Missing are: ['instance_info.image_source']",
            node.uuid
        ));
    }
    crate::conductor::check_image_info(node)?;
    match node.properties.get("root_device") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(hints)) => rivet_protocol::hints::validate(hints)
            .map_err(|e| format!("node {}: properties.root_device: {e}", node.ident())),
        Some(other) => Err(format!(
            "node {}: properties.root_device must be an object of root device hints, not {other}",
            node.ident()
        )),
    }
}

// ------------------------------------------------------------------ boot device

fn device_list(devices: &[BootDevice]) -> Vec<&'static str> {
    devices.iter().map(|d| d.as_str()).collect()
}

/// `GET …/management/boot_device/supported`: the devices the node's driver can set.
async fn boot_device_supported(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let node = state.conductor.store.get_node(&ident).await?;
    let bmc = state.conductor.bmc(&node)?;
    Ok(Json(json!({
        "supported_boot_devices": device_list(bmc.supported_boot_devices()),
    })))
}

/// `GET …/management/boot_device`: `{"boot_device", "persistent"}` as the BMC reports them
/// (null where it does not say).
async fn boot_device_get(
    State(state): State<AppState>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    let s = bmc
        .get_boot_device(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    Ok(Json(json!({
        "boot_device": s.boot_device.map(BootDevice::as_str),
        "persistent": s.persistent,
    })))
}

/// Ironic's boolean words (oslo `bool_from_string`, strict).
fn parse_bool(name: &str, v: &Value) -> Result<bool, ApiError> {
    let word = match v {
        Value::Bool(b) => return Ok(*b),
        Value::String(s) => s.trim().to_ascii_lowercase(),
        other => other.to_string(),
    };
    match word.as_str() {
        "1" | "t" | "true" | "on" | "y" | "yes" => Ok(true),
        "0" | "f" | "false" | "off" | "n" | "no" => Ok(false),
        _ => Err(ApiError::bad_request(format!(
            "Invalid value for {name}: {} is not a boolean; use true or false",
            py_repr(v)
        ))),
    }
}

const MISSING_BOOT_DEVICE: &str =
    "Missing argument: \"boot_device\" (one of pxe, disk, cdrom, bios, safe, uefihttp)";

/// `{"boot_device": NAME, "persistent": BOOL}` (persistent also as a query parameter, as
/// Ironic takes it).
fn boot_device_request(
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<(String, bool), ApiError> {
    if let Some(k) = query.keys().find(|k| *k != "persistent") {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {k:?}; supported: persistent"
        )));
    }
    let m = match json_body(body)? {
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "the body must be a JSON object {{\"boot_device\": NAME, \"persistent\": BOOL}}, not {other}"
            )))
        }
        None => Map::new(),
    };
    if let Some(k) = m
        .keys()
        .find(|k| !["boot_device", "persistent"].contains(&k.as_str()))
    {
        return Err(ApiError::bad_request(format!(
            "unknown field {k:?} in the body; expected boot_device and persistent"
        )));
    }
    let device = match m.get("boot_device") {
        Some(Value::String(d)) => d.clone(),
        None | Some(Value::Null) => return Err(ApiError::bad_request(MISSING_BOOT_DEVICE)),
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "Invalid value for boot_device: {} is not a string",
                py_repr(other)
            )))
        }
    };
    let persistent = match (m.get("persistent"), query.get("persistent")) {
        (Some(v), _) if !v.is_null() => parse_bool("persistent", v)?,
        (_, Some(q)) => parse_bool("persistent", &Value::from(q.as_str()))?,
        _ => false,
    };
    Ok((device, persistent))
}

/// `PUT …/management/boot_device`: 204; 400 for a device the driver does not support; 409
/// while another operation holds the node.
async fn boot_device_set(
    State(state): State<AppState>,
    Path(ident): Path<String>,
    Query(query): Query<HashMap<String, String>>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let (name, persistent) = boot_device_request(&query, &body)?;
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    let supported = bmc.supported_boot_devices();
    let Some(device) = BootDevice::from_name(&name).filter(|d| supported.contains(d)) else {
        return Err(ApiError::bad_request(format!(
            "Invalid boot device {name} specified, supported are {}.",
            device_list(supported).join(", ")
        )));
    };
    let set = if persistent {
        bmc.set_boot_device_persistent(&node.uuid, &node.driver_info, device)
            .await
    } else {
        bmc.set_boot_device(&node.uuid, &node.driver_info, device)
            .await
    };
    set.map_err(|e| driver_error(&node, e))?;
    tracing::info!(node = %node.uuid, device = device.as_str(), persistent, "boot device set through the API");
    Ok(StatusCode::NO_CONTENT)
}

// ------------------------------------------------------------------ virtual media

/// Ironic's `boot_devices.VMEDIA_DEVICES`.
const VMEDIA_DEVICES: &[&str] = &["disk", "cdrom", "floppy"];
/// Ironic's `image_download_source` values.
const DOWNLOAD_SOURCES: &[&str] = &["http", "local", "swift"];
/// Ironic's `VMEDIA_SUPPORTED_URL_SCHEMES`.
const VMEDIA_URL_SCHEMES: &[&str] = &["http", "https", "nfs", "cifs", "smb"];

/// Ironic refuses virtual media on a node in maintenance for a power failure (503).
fn refuse_power_failure(node: &Node, action: &str) -> Result<(), ApiError> {
    if node.maintenance && node.fault.as_deref() == Some("power failure") {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "Unable to {action} virtual media for node {} due to power failure state",
                node.uuid
            ),
        ));
    }
    Ok(())
}

/// The scheme of a URL as Python's `urlparse` finds it (lower case; empty when none).
fn url_scheme(url: &str) -> String {
    match url.find(':') {
        Some(i) if i > 0 => {
            let head = &url[..i];
            let ok = head.as_bytes()[0].is_ascii_alphabetic()
                && head
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b));
            if ok {
                head.to_ascii_lowercase()
            } else {
                String::new()
            }
        }
        _ => String::new(),
    }
}

/// An attach request: (device_type, image_url, image_download_source).
struct Attach {
    device_type: String,
    image_url: String,
    download_source: String,
}

/// The body of `POST …/vmedia` checked as Ironic's `VMEDIA_ATTACH_VALIDATOR` checks it.
fn attach_body(body: &Bytes) -> Result<Attach, ApiError> {
    let v = json_body(body)?.unwrap_or(Value::Null);
    let Value::Object(m) = v else {
        return Err(schema_error(
            "vmedia",
            format!("{} is not of type 'object'", py_repr(&v)),
        ));
    };
    let known = ["device_type", "image_url", "image_download_source"];
    let extras: Vec<&String> = m.keys().filter(|k| !known.contains(&k.as_str())).collect();
    if !extras.is_empty() {
        return Err(schema_error("vmedia", extras_message(&extras)));
    }
    for required in ["device_type", "image_url"] {
        if !m.contains_key(required) {
            return Err(schema_error(
                "vmedia",
                format!("{} is a required property", py_str(required)),
            ));
        }
    }
    let string = |k: &str, allowed: Option<&[&str]>| -> Result<Option<String>, ApiError> {
        let Some(v) = m.get(k) else { return Ok(None) };
        let Some(s) = v.as_str() else {
            return Err(schema_error(
                "vmedia",
                format!("{} is not of type 'string'", py_repr(v)),
            ));
        };
        if let Some(allowed) = allowed.filter(|a| !a.contains(&s)) {
            let list: Vec<String> = allowed.iter().map(|a| py_str(a)).collect();
            return Err(schema_error(
                "vmedia",
                format!("{} is not one of [{}]", py_str(s), list.join(", ")),
            ));
        }
        Ok(Some(s.to_string()))
    };
    let device_type = string("device_type", Some(VMEDIA_DEVICES))?.unwrap_or_default();
    let image_url = string("image_url", None)?.unwrap_or_default();
    let download_source =
        string("image_download_source", Some(DOWNLOAD_SOURCES))?.unwrap_or_else(|| "local".into());
    let scheme = url_scheme(&image_url);
    if !VMEDIA_URL_SCHEMES.contains(&scheme.as_str()) {
        return Err(ApiError::bad_request(format!(
            "Unsupported or missing URL scheme: {scheme}"
        )));
    }
    Ok(Attach {
        device_type,
        image_url,
        download_source,
    })
}

/// `POST /v1/nodes/{node}/vmedia` (1.89): insert an image (204). Rivet inserts at once and
/// answers with the BMC's verdict, where Ironic answers 204 first and records a failure in
/// `last_error`.
async fn vmedia_attach(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(ident): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    vmedia_gate(version, VMEDIA_VERSION, &ident)?;
    let req = attach_body(&body)?;
    let (node, bmc) = node_for_bmc(&state, &ident, true).await?;
    refuse_power_failure(&node, "attach")?;
    if req.device_type != "cdrom" {
        return Err(ApiError::bad_request(format!(
            "device_type {:?} is not supported: Rivet's drivers attach virtual media as a cdrom only",
            req.device_type
        )));
    }
    if req.download_source == "swift" {
        return Err(ApiError::bad_request(
            "image_download_source \"swift\" is not supported: Rivet has no object store; use http (the BMC downloads image_url itself)",
        ));
    }
    if !matches!(url_scheme(&req.image_url).as_str(), "http" | "https") {
        return Err(ApiError::bad_request(format!(
            "image_url {:?}: Rivet's drivers hand the BMC http and https URLs only",
            req.image_url
        )));
    }
    bmc.insert_virtual_media(&node.uuid, &node.driver_info, &req.image_url)
        .await
        .map_err(|e| driver_error(&node, e))?;
    tracing::info!(node = %node.uuid, device_type = %req.device_type, "virtual media attached through the API");
    Ok(StatusCode::NO_CONTENT)
}

/// `?device_types=cdrom,disk` (comma separated and/or repeated), checked against Ironic's
/// list.
fn device_types(query: &[(String, String)]) -> Result<Option<Vec<String>>, ApiError> {
    if let Some((k, _)) = query.iter().find(|(k, _)| k != "device_types") {
        return Err(ApiError::bad_request(format!(
            "unknown query parameter {k:?}; supported: device_types"
        )));
    }
    let types: Vec<String> = query
        .iter()
        .flat_map(|(_, v)| v.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect();
    check_device_types(types)
}

fn check_device_types(types: Vec<String>) -> Result<Option<Vec<String>>, ApiError> {
    if types.is_empty() {
        return Ok(None);
    }
    let invalid: Vec<&str> = types
        .iter()
        .map(String::as_str)
        .filter(|t| !VMEDIA_DEVICES.contains(t))
        .collect();
    if !invalid.is_empty() {
        return Err(ApiError::bad_request(format!(
            "Invalid device type(s) {} (valid are {})",
            invalid.join(", "),
            VMEDIA_DEVICES.join(", ")
        )));
    }
    Ok(Some(types))
}

async fn detach(
    state: &AppState,
    version: (u32, u32),
    ident: &str,
    types: Result<Option<Vec<String>>, ApiError>,
) -> ApiResult<StatusCode> {
    vmedia_gate(version, VMEDIA_VERSION, ident)?;
    let types = types?;
    let (node, bmc) = node_for_bmc(state, ident, true).await?;
    refuse_power_failure(&node, "detach")?;
    if let Some(t) = types.as_ref().filter(|t| !t.iter().any(|t| t == "cdrom")) {
        return Err(ApiError::bad_request(format!(
            "device_types {} cannot be detached: Rivet's drivers attach and detach virtual media as a cdrom only",
            t.join(", ")
        )));
    }
    bmc.eject_virtual_media(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    tracing::info!(node = %node.uuid, "virtual media detached through the API");
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/nodes/{node}/vmedia[?device_types=…]` (1.89): eject (204).
async fn vmedia_detach(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(ident): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> ApiResult<StatusCode> {
    detach(&state, version, &ident, device_types(&query)).await
}

/// `DELETE /v1/nodes/{node}/vmedia/{device_type}` (1.89).
async fn vmedia_detach_one(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path((ident, device_type)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    detach(
        &state,
        version,
        &ident,
        check_device_types(vec![device_type]),
    )
    .await
}

/// `GET /v1/nodes/{node}/vmedia` (1.93): the BMC's virtual media devices, a bare list as
/// Ironic answers it.
async fn vmedia_get(
    State(state): State<AppState>,
    Extension(ApiVersion(version)): Extension<ApiVersion>,
    Path(ident): Path<String>,
) -> ApiResult<Json<Value>> {
    vmedia_gate(version, VMEDIA_GET_VERSION, &ident)?;
    let (node, bmc) = node_for_bmc(&state, &ident, false).await?;
    let media = bmc
        .get_virtual_media(&node.uuid, &node.driver_info)
        .await
        .map_err(|e| driver_error(&node, e))?;
    Ok(Json(json!(media)))
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
    fn python_reprs() {
        assert_eq!(py_str("it's"), "\"it's\"");
        assert_eq!(py_str("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(py_str("x\ny"), "'x\\ny'");
        assert_eq!(
            py_repr(&json!({"a": [true, null, 1]})),
            "{'a': [True, None, 1]}"
        );
        let a = "a".to_string();
        let b = "b".to_string();
        assert_eq!(
            extras_message(&[&b, &a]),
            "Additional properties are not allowed ('a', 'b' were unexpected)"
        );
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

    #[test]
    fn attach_bodies() {
        let a = |s: &str| attach_body(&Bytes::from(s.to_string()));
        let ok = a(r#"{"device_type": "cdrom", "image_url": "HTTP://x/y.iso"}"#).unwrap();
        assert_eq!(
            (ok.device_type.as_str(), ok.download_source.as_str()),
            ("cdrom", "local")
        );
        let msg = |s: &str| a(s).err().map(|e| e.message).unwrap_or_default();
        assert_eq!(
            msg(r#"{"image_url": "http://image"}"#),
            "Schema error for vmedia: 'device_type' is a required property"
        );
        assert_eq!(
            msg(r#"{"device_type": "cat", "image_url": "http://image"}"#),
            "Schema error for vmedia: 'cat' is not one of ['disk', 'cdrom', 'floppy']"
        );
        assert_eq!(
            msg(r#"{"device_type": "cdrom", "image_url": "abcd"}"#),
            "Unsupported or missing URL scheme: "
        );
        assert_eq!(
            msg(r#"{"device_type": "cdrom", "image_url": "ftp://h/x"}"#),
            "Unsupported or missing URL scheme: ftp"
        );
        assert!(msg(
            r#"{"device_type": "cdrom", "image_url": "http://h", "image_download_source": "ftp"}"#
        )
        .contains("'ftp' is not one of ['http', 'local', 'swift']"));
        assert!(
            msg(r#"{"device_type": "cdrom", "image_url": "http://h", "x": 1}"#)
                .contains("('x' was unexpected)")
        );
    }

    #[test]
    fn url_schemes_as_python_reads_them() {
        assert_eq!(url_scheme("https://h/x"), "https");
        assert_eq!(url_scheme("NFS://h/x"), "nfs");
        assert_eq!(url_scheme("abcd"), "");
        assert_eq!(url_scheme("1http://h"), "");
        assert_eq!(url_scheme(":x"), "");
    }

    #[test]
    fn detach_device_types() {
        let q = |v: &[(&str, &str)]| {
            device_types(
                &v.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(q(&[]).unwrap(), None);
        assert_eq!(
            q(&[("device_types", "cdrom,disk"), ("device_types", "floppy")]).unwrap(),
            Some(vec!["cdrom".into(), "disk".into(), "floppy".into()])
        );
        assert_eq!(
            q(&[("device_types", "cdrom,cat")]).unwrap_err().message,
            "Invalid device type(s) cat (valid are disk, cdrom, floppy)"
        );
        assert!(q(&[("types", "cdrom")]).is_err());
    }

    #[test]
    fn boot_device_requests() {
        let none = HashMap::new();
        let r = |q: &HashMap<String, String>, b: &str| {
            boot_device_request(q, &Bytes::from(b.to_string()))
        };
        assert_eq!(
            r(&none, r#"{"boot_device": "pxe"}"#).unwrap(),
            ("pxe".into(), false)
        );
        assert_eq!(
            r(&none, r#"{"boot_device": "disk", "persistent": true}"#).unwrap(),
            ("disk".into(), true)
        );
        let q = HashMap::from([("persistent".to_string(), "True".to_string())]);
        assert_eq!(
            r(&q, r#"{"boot_device": "pxe"}"#).unwrap(),
            ("pxe".into(), true)
        );
        let q = HashMap::from([("persistent".to_string(), "blah".to_string())]);
        assert!(r(&q, r#"{"boot_device": "pxe"}"#).is_err());
        assert!(r(&none, "{}").is_err());
        assert!(r(&none, r#"{"boot_device": 5}"#).is_err());
        assert!(r(&none, r#"{"boot_device": "pxe", "colour": 1}"#).is_err());
    }

    #[test]
    fn image_verdicts() {
        let mut n = Node::new("u-1".into(), "fake-hardware".into());
        assert!(image_verdict(&n)
            .unwrap_err()
            .contains("Missing are: ['instance_info.image_source']"));
        n.instance_info
            .insert("image_source".into(), json!("http://h/i.raw"));
        assert!(image_verdict(&n).unwrap_err().contains("no image checksum"));
        n.instance_info
            .insert("image_os_hash_algo".into(), json!("sha256"));
        assert!(image_verdict(&n)
            .unwrap_err()
            .contains("image_os_hash_value"));
        // What deploy refuses, validate refuses too (an MD5 digest).
        let mut md5 = Node::new("u-2".into(), "fake-hardware".into());
        md5.instance_info
            .insert("image_source".into(), json!("http://h/i.raw"));
        md5.instance_info
            .insert("image_checksum".into(), json!("ab".repeat(16)));
        assert!(image_verdict(&md5).unwrap_err().contains("MD5"));
        n.instance_info
            .insert("image_os_hash_value".into(), json!("ab".repeat(32)));
        assert_eq!(image_verdict(&n), Ok(()));
        n.properties
            .insert("root_device".into(), json!({"colour": "blue"}));
        assert!(image_verdict(&n).unwrap_err().contains("root_device"));
    }
}
