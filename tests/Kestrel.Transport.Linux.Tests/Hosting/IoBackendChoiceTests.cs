using System.Diagnostics.Metrics;
using System.Net;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Options;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// IoBackend.Auto and IoBackend.IoUring, in process: which engine the loops get, what the log says and what the meter
/// counts. Where io_uring is really blocked (seccomp, in a child process) is TechEmpower.Tests' IoUringFallbackTests;
/// here the managed engine, which has no ring path, stands in for a host without io_uring.
/// </summary>
public sealed class IoBackendChoiceTests
{
    private const string FallbackCounter = "kestrel.transport.linux.io_uring.fallbacks";

    [Fact]
    public async Task Auto_with_Inline_scheduling_runs_every_loop_on_io_uring_where_the_kernel_allows_it_and_says_so()
    {
        Assert.True(KernelFeatures.RingHere.Available, $"io_uring is unavailable on this machine ({KernelFeatures.RingHere.Description}); the CI and dev machines allow it.");
        var run = await BindAsync(IoBackend.Auto, useNativeEngine: true, ApplicationSchedulingMode.Inline);

        Assert.All(run.Backends, b => Assert.Equal(IoBackend.IoUring, b));
        Assert.Contains(run.Logs, l => l.Level == LogLevel.Information && l.Message.StartsWith("IoBackend=Auto: the loops run on io_uring (", StringComparison.Ordinal));
        Assert.DoesNotContain(run.Logs, l => l.Level >= LogLevel.Warning);
        Assert.Equal(0, run.Fallbacks);
    }

    [Theory]
    [InlineData(ApplicationSchedulingMode.ThreadPool)]
    [InlineData(ApplicationSchedulingMode.Adaptive)]
    public async Task Auto_with_ThreadPool_or_Adaptive_scheduling_runs_on_epoll_and_says_why(ApplicationSchedulingMode scheduling)
    {
        var run = await BindAsync(IoBackend.Auto, useNativeEngine: true, scheduling);

        Assert.All(run.Backends, b => Assert.Equal(IoBackend.Epoll, b));
        Assert.Contains(run.Logs, l => l.Level == LogLevel.Information && l.Message.Contains($"the loops run on epoll with {scheduling} scheduling: with ThreadPool scheduling io_uring measured no better than epoll, and with Adaptive scheduling a ring that can follow its loop to another thread measured level with epoll", StringComparison.Ordinal));
        Assert.DoesNotContain(run.Logs, l => l.Level >= LogLevel.Warning);
        Assert.Equal(0, run.Fallbacks);
    }

    [Fact]
    public async Task Auto_falls_back_to_epoll_with_one_warning_and_counts_every_loop_where_io_uring_cannot_be_had()
    {
        var run = await BindAsync(IoBackend.Auto, useNativeEngine: false, ApplicationSchedulingMode.Inline);

        Assert.All(run.Backends, b => Assert.Equal(IoBackend.Epoll, b));
        var warning = Assert.Single(run.Logs, l => l.Level == LogLevel.Warning);
        Assert.Contains("io_uring is not available here, so the loops run on epoll", warning.Message, StringComparison.Ordinal);
        Assert.Contains("no io_uring path", warning.Message, StringComparison.Ordinal);
        Assert.Equal(Transports.LinuxThreadCount, run.Fallbacks);
    }

    [Fact]
    public async Task An_explicit_IoUring_that_cannot_be_had_fails_the_bind_naming_the_option_and_the_cause()
    {
        var error = await Assert.ThrowsAsync<InvalidOperationException>(() => BindAsync(IoBackend.IoUring, useNativeEngine: false, ApplicationSchedulingMode.ThreadPool));

        Assert.StartsWith("LinuxTransportOptions.IoBackend is IoUring, but io_uring is not available here: ", error.Message, StringComparison.Ordinal);
        Assert.Contains("no io_uring path", error.Message, StringComparison.Ordinal);
        Assert.Contains("Set IoBackend to Auto", error.Message, StringComparison.Ordinal);
    }

    [Theory]
    [InlineData(Errno.EPERM, "Operation not permitted (errno 1); likely cause: a seccomp profile")]
    [InlineData(Errno.EPERM, "kernel.io_uring_disabled")]
    [InlineData(Errno.ENOSYS, "Function not implemented (errno 38); likely cause: a seccomp profile that answers io_uring with ENOSYS")]
    [InlineData(Errno.ENOMEM, "RLIMIT_MEMLOCK")]
    [InlineData(Errno.EINVAL, "older than 5.19")]
    public void A_failed_io_uring_setup_is_explained_by_its_errno(int errno, string expected)
    {
        string explanation = IoUringTroubleshooting.Explain(errno);
        Assert.StartsWith("io_uring_setup failed: ", explanation, StringComparison.Ordinal);
        Assert.Contains(expected, explanation, StringComparison.Ordinal);
    }

    private static async Task<Run> BindAsync(IoBackend backend, bool useNativeEngine, ApplicationSchedulingMode scheduling)
    {
        using var services = new ServiceCollection().AddMetrics().BuildServiceProvider();
        var meterFactory = services.GetRequiredService<IMeterFactory>();
        using var recorder = new MeasurementRecorder(meterFactory);
        var logs = new RecordingLoggerProvider();
        using var loggerFactory = LoggerFactory.Create(b => b.AddProvider(logs).SetMinimumLevel(LogLevel.Information));
        var options = new LinuxTransportOptions { ThreadCount = Transports.LinuxThreadCount, IoBackend = backend, ApplicationSchedulingMode = scheduling };
        options.Tuning.UseNativeEngine = useNativeEngine;

        var factory = new LinuxTransportFactory(Options.Create(options), loggerFactory, new DiagnosticMemoryPoolFactory(), meterFactory);
        await using (factory)
        {
            var listener = await factory.BindAsync(new IPEndPoint(IPAddress.Loopback, 0));
            var backends = factory.Loops.Select(l => l.Engine.Backend).ToList();
            await listener.UnbindAsync();
            await listener.DisposeAsync();
            recorder.Collect();
            return new Run(backends, logs.Entries.Where(e => e.Category == TransportLog.Category).ToList(), recorder.Sum(FallbackCounter));
        }
    }

    private sealed record Run(List<IoBackend> Backends, List<LogEntry> Logs, long Fallbacks);

    private sealed record LogEntry(string Category, LogLevel Level, string Message);

    private sealed class RecordingLoggerProvider : ILoggerProvider
    {
        private readonly List<LogEntry> _entries = [];

        public IReadOnlyList<LogEntry> Entries
        {
            get
            {
                lock (_entries)
                {
                    return [.. _entries];
                }
            }
        }

        public ILogger CreateLogger(string categoryName) => new Logger(this, categoryName);

        public void Dispose()
        {
        }

        private sealed class Logger(RecordingLoggerProvider provider, string category) : ILogger
        {
            public IDisposable? BeginScope<TState>(TState state)
                where TState : notnull => null;

            public bool IsEnabled(LogLevel logLevel) => true;

            public void Log<TState>(LogLevel logLevel, EventId eventId, TState state, Exception? exception, Func<TState, Exception?, string> formatter)
            {
                lock (provider._entries)
                {
                    provider._entries.Add(new LogEntry(category, logLevel, formatter(state, exception)));
                }
            }
        }
    }
}
