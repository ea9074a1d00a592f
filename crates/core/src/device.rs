//! Choosing where a model runs: `cpu` (burn's `flex` backend, always built, with hookscope's
//! own CPU kernels), or a backend the build compiled in through a cargo feature: `wgpu[:N]`
//! (any GPU API wgpu finds, WGSL or SPIR-V), `vulkan[:N]` (wgpu pinned to Vulkan),
//! `cuda[:N]` (burn-cuda) and `ndarray` (burn-ndarray, an alternative CPU backend).
//!
//! `N` counts the devices `hookscope devices` lists for that backend, from 0; without it the
//! backend picks (wgpu prefers a high-power GPU, CUDA takes device 0).

use std::fmt;
use std::str::FromStr;

use burn::backend::Flex;
use burn::tensor::{Device, Tensor};

use crate::error::{Error, Result};

/// A device named by the user: the backend and, where the backend has several, which one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The CPU through burn's `flex` backend and hookscope's packed kernels (the default).
    #[default]
    Cpu,
    /// A wgpu device (Vulkan, Metal, DX12 or GL, chosen by wgpu); `None`: wgpu's best.
    Wgpu(Option<usize>),
    /// A wgpu device on the Vulkan API; `None`: the best one.
    Vulkan(Option<usize>),
    /// A CUDA device; `None`: device 0.
    Cuda(Option<usize>),
    /// The CPU through burn's `ndarray` backend (no packed kernels).
    Ndarray,
}

impl DeviceChoice {
    /// Every backend hookscope knows, built or not, each with its own default device, in the
    /// order `hookscope devices` lists them.
    pub const ALL: [DeviceChoice; 5] = [
        DeviceChoice::Cpu,
        DeviceChoice::Wgpu(None),
        DeviceChoice::Vulkan(None),
        DeviceChoice::Cuda(None),
        DeviceChoice::Ndarray,
    ];

    /// The backend's name as written on the command line (and, but for `cpu`, the cargo
    /// feature that builds it).
    pub fn backend(&self) -> &'static str {
        match self {
            DeviceChoice::Cpu => "cpu",
            DeviceChoice::Wgpu(_) => "wgpu",
            DeviceChoice::Vulkan(_) => "vulkan",
            DeviceChoice::Cuda(_) => "cuda",
            DeviceChoice::Ndarray => "ndarray",
        }
    }

    /// Whether this build compiled the backend in.
    pub fn is_built(&self) -> bool {
        match self {
            DeviceChoice::Cpu => true,
            DeviceChoice::Wgpu(_) => cfg!(feature = "wgpu"),
            DeviceChoice::Vulkan(_) => cfg!(feature = "vulkan"),
            DeviceChoice::Cuda(_) => cfg!(feature = "cuda"),
            DeviceChoice::Ndarray => cfg!(feature = "ndarray"),
        }
    }

    /// Device `index` of the same backend (the CPU backends have one device: unchanged).
    pub fn numbered(self, index: usize) -> DeviceChoice {
        match self {
            DeviceChoice::Wgpu(_) => DeviceChoice::Wgpu(Some(index)),
            DeviceChoice::Vulkan(_) => DeviceChoice::Vulkan(Some(index)),
            DeviceChoice::Cuda(_) => DeviceChoice::Cuda(Some(index)),
            DeviceChoice::Cpu | DeviceChoice::Ndarray => self,
        }
    }

    /// The device, checked: an error names the cargo feature a missing backend needs, says
    /// that the machine has no such device, or how many there are when the index is beyond
    /// them.
    pub fn open(&self) -> Result<Device> {
        if !self.is_built() {
            return Err(self.error(format!(
                "this build has no `{backend}` backend: rebuild with `--features {backend}` \
                 (`hookscope devices` lists what this build can use)",
                backend = self.backend()
            )));
        }
        let index = match self {
            DeviceChoice::Cpu | DeviceChoice::Ndarray => return Ok(self.default_device()),
            DeviceChoice::Wgpu(index) | DeviceChoice::Vulkan(index) | DeviceChoice::Cuda(index) => {
                *index
            }
        };
        // A GPU backend: the machine must have the device before burn is asked to open it (an
        // adapter that is not there is a panic inside the runtime, not an error).
        let devices = self.enumerate();
        if devices.is_empty() {
            let hint = match self {
                DeviceChoice::Cuda(_) => "",
                _ => {
                    "; without a GPU, Mesa's software Vulkan driver (Debian's \
                     mesa-vulkan-drivers and libvulkan1) provides one"
                }
            };
            return Err(self.error(format!(
                "this machine has no {} device (no driver or adapter found{hint})",
                self.backend()
            )));
        }
        match index {
            None => Ok(self.default_device()),
            Some(index) => devices.get(index).cloned().ok_or_else(|| {
                self.error(format!(
                    "this machine has {} {} device(s) (numbered from 0); `hookscope devices` \
                     lists them",
                    devices.len(),
                    self.backend()
                ))
            }),
        }
    }

    /// The backend's own default device. Only called for a backend this build has.
    fn default_device(&self) -> Device {
        match self {
            DeviceChoice::Cpu => Device::flex(),
            #[cfg(feature = "wgpu")]
            DeviceChoice::Wgpu(_) => Device::wgpu(burn::tensor::DeviceKind::DefaultDevice),
            #[cfg(feature = "vulkan")]
            DeviceChoice::Vulkan(_) => Device::vulkan(burn::tensor::DeviceKind::DefaultDevice),
            #[cfg(feature = "cuda")]
            DeviceChoice::Cuda(_) => Device::cuda(0usize),
            // burn 0.22 deprecates burn-ndarray in favour of flex (our `cpu`); it stays an
            // opt-in second CPU backend, a cross-check of the model code on another backend.
            #[cfg(feature = "ndarray")]
            #[allow(deprecated)]
            DeviceChoice::Ndarray => Device::ndarray(),
            #[allow(unreachable_patterns)]
            _ => unreachable!("`open` checks the backend is built"),
        }
    }

    /// Every device of this backend the machine has, in the order `N` counts them.
    pub fn enumerate(&self) -> Vec<Device> {
        use burn::tensor::DeviceType;
        let kind: Option<DeviceType> = match self {
            DeviceChoice::Cpu => Some(DeviceType::Flex),
            #[cfg(feature = "wgpu")]
            DeviceChoice::Wgpu(_) => Some(DeviceType::Wgpu),
            #[cfg(feature = "vulkan")]
            DeviceChoice::Vulkan(_) => Some(DeviceType::Vulkan),
            #[cfg(feature = "cuda")]
            DeviceChoice::Cuda(_) => Some(DeviceType::Cuda),
            #[cfg(feature = "ndarray")]
            DeviceChoice::Ndarray => Some(DeviceType::NdArray),
            #[allow(unreachable_patterns)]
            _ => None,
        };
        kind.map(|kind| Device::enumerate(kind).into_vec())
            .unwrap_or_default()
    }

    fn error(&self, reason: String) -> Error {
        Error::Device {
            device: self.to_string(),
            reason,
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Wgpu(Some(index))
            | DeviceChoice::Vulkan(Some(index))
            | DeviceChoice::Cuda(Some(index)) => write!(f, "{}:{index}", self.backend()),
            _ => f.write_str(self.backend()),
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = Error;

    /// `cpu`, `wgpu[:N]`, `vulkan[:N]`, `cuda[:N]` or `ndarray` (case-insensitive).
    fn from_str(text: &str) -> Result<Self> {
        let lower = text.trim().to_ascii_lowercase();
        let (backend, index) = match lower.split_once(':') {
            Some((backend, index)) => (backend, Some(index)),
            None => (lower.as_str(), None),
        };
        let invalid = |reason: String| Error::Device {
            device: text.to_string(),
            reason,
        };
        let index = index
            .map(|index| {
                index.parse::<usize>().map_err(|_| {
                    invalid(format!(
                        "`{index}` is not a device number (0, 1, ...): write `{backend}:0`"
                    ))
                })
            })
            .transpose()?;
        let choice = match backend {
            "cpu" | "flex" => DeviceChoice::Cpu,
            "wgpu" => DeviceChoice::Wgpu(index),
            "vulkan" => DeviceChoice::Vulkan(index),
            "cuda" => DeviceChoice::Cuda(index),
            "ndarray" => DeviceChoice::Ndarray,
            _ => {
                return Err(invalid(
                    "expected cpu, wgpu[:N], vulkan[:N], cuda[:N] or ndarray".to_string(),
                ));
            }
        };
        if index.is_some() && matches!(choice, DeviceChoice::Cpu | DeviceChoice::Ndarray) {
            return Err(invalid(format!(
                "`{backend}` is one device and takes no number"
            )));
        }
        Ok(choice)
    }
}

/// Whether `device` is the CPU backend (`flex`), where weights are packed and hookscope's own
/// kernels (`crate::cpu`) run. This is the one place that asks which backend a device is.
pub fn is_cpu(device: &Device) -> bool {
    Tensor::<1>::zeros([0], device)
        .try_into_primitive::<Flex>()
        .is_ok()
}

/// A human name for `device`: the adapter's own name where the backend reports one (a GPU, or
/// a software rasterizer such as lavapipe), else what the backend is.
pub fn describe(device: &Device) -> String {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let Some(identity) = device.identity() {
        return identity.name;
    }
    if is_cpu(device) {
        return "the CPU (burn-flex, with hookscope's packed kernels)".to_string();
    }
    format!("{device:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_spelling_and_names_what_is_wrong() {
        assert_eq!("cpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Cpu);
        assert_eq!(
            "CUDA".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Cuda(None)
        );
        assert_eq!(
            "wgpu:1".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Wgpu(Some(1))
        );
        assert_eq!(
            "vulkan:0".parse::<DeviceChoice>().unwrap(),
            DeviceChoice::Vulkan(Some(0))
        );
        for choice in ["cpu", "wgpu", "wgpu:3", "vulkan:0", "cuda:2", "ndarray"] {
            assert_eq!(choice.parse::<DeviceChoice>().unwrap().to_string(), choice);
        }
        let error = "tpu".parse::<DeviceChoice>().unwrap_err().to_string();
        assert!(
            error.contains("`tpu`") && error.contains("wgpu[:N]"),
            "{error}"
        );
        let error = "cuda:x".parse::<DeviceChoice>().unwrap_err().to_string();
        assert!(error.contains("`x` is not a device number"), "{error}");
        let error = "cpu:1".parse::<DeviceChoice>().unwrap_err().to_string();
        assert!(error.contains("takes no number"), "{error}");
    }

    #[test]
    fn the_cpu_is_always_built_and_a_missing_backend_names_its_feature() {
        let cpu = DeviceChoice::Cpu.open().unwrap();
        assert!(is_cpu(&cpu));
        #[cfg(not(feature = "cuda"))]
        {
            let error = DeviceChoice::Cuda(None).open().unwrap_err().to_string();
            assert!(error.contains("--features cuda"), "{error}");
        }
        assert!(DeviceChoice::Cpu.is_built());
        assert_eq!(DeviceChoice::Cuda(None).numbered(2).to_string(), "cuda:2");
        assert_eq!(DeviceChoice::Cpu.numbered(2), DeviceChoice::Cpu);
    }
}
