// A caching allocator for CPU tensors (tinygpt/cpu_allocator.py builds it and installs it for CPU training).
//
// A training step allocates the same tensors, of the same sizes, in the same order, every step. glibc's
// malloc either hands big blocks back to the kernel when they are freed, so that every step faults its
// activations in again page by page, or, told to keep them, packs them into one heap that fragments as
// blocks of different sizes come and go. This allocator keeps each freed big block in a list of blocks of
// exactly its size (whole pages, mapped with mmap) and hands it out again to the next tensor of that size:
// after the first step nothing is mapped, faulted in or fragmented. It is what PyTorch's CUDA allocator does
// on the GPU, simplified by the trainer's sizes repeating exactly (no splitting of blocks).
//
// What it holds is bounded: a request that no kept block fits first unmaps kept blocks, those of the sizes
// least recently asked for first, until live plus kept memory stays within twice the most that was ever
// live at once. Small tensors (under MIN_CACHED bytes) go to malloc, which keeps and reuses small blocks
// itself.
//
// Every block, big or small, starts with a HEADER of bytes before the tensor's data that records its size,
// so that the deleter (which gets only the data pointer: PyTorch's raw_allocate requires data == context)
// knows where the block came from. Data stays aligned to 64 bytes, as PyTorch's own CPU allocator aligns it.

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

constexpr size_t HEADER = 64;            // bytes before the data; also the alignment of the data
constexpr size_t MIN_CACHED = 1 << 20;   // blocks this big or bigger are mapped and kept (1 MiB)
constexpr size_t HELD_FACTOR = 2;        // live + kept memory stays within this times the live peak
constexpr size_t FROM_MALLOC = 0;        // the header's size of a small block (malloc'd, freed with free)

struct Header {
  size_t mapped;   // bytes mapped for this block (header included), or FROM_MALLOC
  size_t request;  // bytes the tensor asked for (what the profiler is told)
};
static_assert(sizeof(Header) <= HEADER, "the header must fit before the data");

struct SizeClass {
  std::vector<void*> kept;  // blocks of this size, free for the next request
  uint64_t last_asked = 0;  // the request count when this size was last asked for
};

class CachingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return {nullptr, nullptr, &CachingAllocator::release, c10::Device(c10::DeviceType::CPU)};
    void* data = n + HEADER < MIN_CACHED ? small(n) : big(n);
    report(data, static_cast<int64_t>(n));
    return {data, data, &CachingAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &CachingAllocator::release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  static CachingAllocator& instance() {
    static auto* it = [] {
      auto* a = new CachingAllocator();  // never destroyed: tensors may outlive static destructors
      // fork() copies the lock as it is: held by another thread at that moment (a backward pass
      // allocating without the GIL), it would stay held in the child for ever. Hold it across fork, as
      // glibc's malloc does with its own locks.
      pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                     [] { instance().mu_.unlock(); });
      return a;
    }();
    return *it;
  }

  // Whether it now serves CPU tensors: not where something else was installed with a higher priority.
  bool install() {
    std::lock_guard<std::mutex> lock(mu_);
    if (installed_) return true;
    previous_ = c10::GetCPUAllocator();
    c10::SetCPUAllocator(this, 0);  // priority 0, as PyTorch's own: uninstall() can put it back
    installed_ = c10::GetCPUAllocator() == this;
    return installed_;
  }

  // PyTorch's allocator serves new tensors again; blocks still in use come back here and are unmapped.
  void uninstall() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!installed_) return;
    c10::SetCPUAllocator(previous_, 0);
    installed_ = false;
    release_kept(SIZE_MAX);
  }

  // Unmaps every kept block; returns the bytes given back.
  size_t empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    return release_kept(SIZE_MAX);
  }

  // For tests: another thread holds the lock for `seconds`, as one in the middle of an allocation would.
  void hold_lock(double seconds) {
    std::atomic<bool> held{false};
    std::thread([this, seconds, &held] {
      std::lock_guard<std::mutex> lock(mu_);
      held = true;  // (the last use of `held`: hold_lock returns once it is set)
      std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    }).detach();
    while (!held) std::this_thread::yield();
  }

  std::map<std::string, int64_t> stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {{"installed", installed_},     {"mapped_bytes", mapped_},   {"kept_bytes", kept_},
            {"live_bytes", mapped_ - kept_}, {"peak_live_bytes", peak_live_}, {"peak_mapped_bytes", peak_mapped_},
            {"hits", hits_},                 {"misses", misses_},       {"unmapped_bytes", unmapped_}};
  }

 private:
  static void release(void* data) { instance().free_block(data); }

  static Header* header_of(void* data) { return reinterpret_cast<Header*>(static_cast<char*>(data) - HEADER); }

  void* small(size_t n) {
    void* base = nullptr;
    if (posix_memalign(&base, HEADER, n + HEADER) != 0) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", n, " bytes");
    }
    void* data = static_cast<char*>(base) + HEADER;
    *header_of(data) = {FROM_MALLOC, n};
    small_live_ += n;
    return data;
  }

  void* big(size_t n) {
    const size_t size = (n + HEADER + page_ - 1) / page_ * page_;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++requests_;
      SizeClass& sc = classes_[size];
      sc.last_asked = requests_;
      if (!sc.kept.empty()) {
        void* data = sc.kept.back();
        sc.kept.pop_back();
        kept_ -= size;
        peak_live_ = std::max(peak_live_, mapped_ - kept_);
        ++hits_;
        header_of(data)->request = n;
        return data;
      }
      ++misses_;
      const size_t live = mapped_ - kept_ + size;
      peak_live_ = std::max(peak_live_, live);
      const size_t limit = HELD_FACTOR * peak_live_;
      if (mapped_ + size > limit) release_kept(mapped_ + size - limit);
      mapped_ += size;  // counted before the mmap so that the limit holds for concurrent requests too
      peak_mapped_ = std::max(peak_mapped_, mapped_);
    }
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
      const int err = errno;
      std::lock_guard<std::mutex> lock(mu_);
      mapped_ -= size;
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: tried to allocate ", n, " bytes (",
                       std::strerror(err), ")");
    }
    void* data = static_cast<char*>(base) + HEADER;
    *header_of(data) = {size, n};
    return data;
  }

  void free_block(void* data) {
    if (data == nullptr) return;
    Header* h = header_of(data);
    report(data, -static_cast<int64_t>(h->request));
    if (h->mapped == FROM_MALLOC) {
      small_live_ -= h->request;
      std::free(h);
      return;
    }
    const size_t size = h->mapped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (installed_) {
        classes_[size].kept.push_back(data);
        kept_ += size;
        return;
      }
      mapped_ -= size;
      unmapped_ += size;
    }
    munmap(h, size);
  }

  // Unmaps kept blocks, of the sizes least recently asked for first, until at least `bytes` are given back
  // or none is kept. Called with mu_ held.
  size_t release_kept(size_t bytes) {
    size_t freed = 0;
    while (freed < bytes && kept_ > 0) {
      auto oldest = classes_.end();
      for (auto it = classes_.begin(); it != classes_.end(); ++it) {
        if (!it->second.kept.empty() &&
            (oldest == classes_.end() || it->second.last_asked < oldest->second.last_asked)) {
          oldest = it;
        }
      }
      const size_t size = oldest->first;
      std::vector<void*>& kept = oldest->second.kept;
      while (!kept.empty() && freed < bytes) {
        munmap(header_of(kept.back()), size);
        kept.pop_back();
        kept_ -= size;
        mapped_ -= size;
        unmapped_ += size;
        freed += size;
      }
      if (kept.empty()) classes_.erase(oldest);  // sizes asked for once (a growing prompt) do not pile up
    }
    return freed;
  }

  // The profiler's memory view (torch.profiler(profile_memory=True)), as PyTorch's CPU allocator reports.
  void report(void* data, int64_t delta) {
    if (!c10::memoryProfilingEnabled()) return;
    const size_t live = small_live_.load();
    std::lock_guard<std::mutex> lock(mu_);
    c10::reportMemoryUsageToProfiler(data, delta, live + mapped_ - kept_, live + mapped_,
                                     c10::Device(c10::DeviceType::CPU));
  }

  std::mutex mu_;
  bool installed_ = false;
  c10::Allocator* previous_ = nullptr;
  const size_t page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::unordered_map<size_t, SizeClass> classes_;
  std::atomic<size_t> small_live_{0};
  size_t mapped_ = 0, kept_ = 0, peak_live_ = 0, peak_mapped_ = 0, unmapped_ = 0;
  uint64_t requests_ = 0, hits_ = 0, misses_ = 0;
};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("install", [] { return CachingAllocator::instance().install(); },
        "serve CPU tensors from the caching allocator from now on; whether it took");
  m.def("uninstall", [] { CachingAllocator::instance().uninstall(); },
        "serve new CPU tensors from PyTorch's allocator again and unmap the kept blocks");
  m.def("empty_cache", [] { return CachingAllocator::instance().empty_cache(); },
        "unmap every kept block; returns the bytes given back");
  m.def("stats", [] { return CachingAllocator::instance().stats(); }, "the allocator's counters, in bytes");
  m.def("_hold_lock_for_test", [](double seconds) { CachingAllocator::instance().hold_lock(seconds); },
        "another thread holds the allocator's lock for this long (tests)");
}
