using System.Reflection;
using Kestrel.Transport.Linux.Engines;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Interop;
using Microsoft.AspNetCore.Connections;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>The transport a test runs against. Every test runs over Sockets too, which proves the test expects what Kestrel's own transport does.</summary>
public enum TransportKind
{
    /// <summary>Kestrel's Sockets transport: the reference behaviour.</summary>
    Sockets,

    /// <summary>The Linux transport with the native batch engine (libktl_native.so).</summary>
    LinuxNative,

    /// <summary>
    /// The Linux transport with its managed fallback engine. Its pool threads send ahead of the batch
    /// (CoalesceThreadPoolSends off), so that both orders of pool sends run every test.
    /// </summary>
    LinuxManaged,

    /// <summary>The Linux transport, native engine, with ApplicationSchedulingMode.Inline (host tests only).</summary>
    LinuxInline,

    /// <summary>
    /// As <see cref="LinuxInline"/>, with SpinBeforeSleepMicroseconds: the loop polls epoll for 200 µs
    /// before every sleep, so requests, wake-ups and posted work also arrive while it spins (host tests only).
    /// </summary>
    LinuxInlineSpin,

    /// <summary>
    /// The Linux transport, native engine, with IoBackend.EpollAio: batches go through io_submit. The
    /// loop makes every send (the SendFromThreadPool tuning off), so that sends go through io_submit too.
    /// </summary>
    LinuxAio,

    /// <summary>
    /// The Linux transport, native engine, with the DeferSend and SendFromThreadPool tunings off: the loop sends each
    /// flush on its next pass (host tests only).
    /// </summary>
    LinuxImmediateSend,

    /// <summary>
    /// The Linux transport, native engine, with zero-copy sends from 1 KiB on, kept on over loopback
    /// (where the kernel copies anyway and would otherwise turn them off after the first completion).
    /// </summary>
    LinuxZeroCopy,

    /// <summary>
    /// The Linux transport on the io_uring engine (IoBackend.IoUring): a ring per loop, multishot polls, batches as
    /// one io_uring_enter each. Pool threads send as in <see cref="LinuxNative"/>.
    /// </summary>
    LinuxIoUring,

    /// <summary>The io_uring engine with ApplicationSchedulingMode.Inline, the combination IoBackend.Auto picks (host tests only).</summary>
    LinuxIoUringInline,

    /// <summary>
    /// The io_uring engine with zero-copy sends as in <see cref="LinuxZeroCopy"/>, the loop making every send (the
    /// SendFromThreadPool tuning off), so that they are the ring's own zero-copy ops (SENDMSG_ZC), notified as
    /// completions of the ring.
    /// </summary>
    LinuxIoUringZeroCopy,

    /// <summary>
    /// The Linux transport, native epoll engine, with ApplicationSchedulingMode.Adaptive: continuations run on the
    /// loop while quick, and a loop whose continuation blocks moves to another thread.
    /// </summary>
    LinuxAdaptive,

    /// <summary>
    /// Adaptive scheduling on the io_uring engine: a movable ring (no SINGLE_ISSUER/DEFER_TASKRUN), so that the loop can
    /// move to another thread with it (host tests only).
    /// </summary>
    LinuxIoUringAdaptive,
}

/// <summary>The theory data that selects transports, and the options each kind stands for.</summary>
public static class Transports
{
    /// <summary>The loop count for the Linux runs: more than one, so that SO_REUSEPORT spreading is always exercised.</summary>
    public const int LinuxThreadCount = 2;

    /// <summary>
    /// The environment variable that limits the kinds below (<see cref="ConnectionLevel"/>, <see cref="HostLevel"/>,
    /// <see cref="AllowBlocking"/>, <see cref="LinuxOnly"/>): a comma-separated list of kind names, where <c>Default</c>
    /// stands for <see cref="DefaultKind"/>. Unset, every kind runs. test.sh sets it for its quick run and its .NET 11 run.
    /// </summary>
    public const string SelectionVariable = "KTL_TEST_TRANSPORTS";

    private static readonly Lazy<TransportKind> s_defaultKind = new(FindDefaultKind);
    private static readonly Lazy<HashSet<TransportKind>?> s_selected = new(() => ParseSelection(Environment.GetEnvironmentVariable(SelectionVariable)));

    /// <summary>Transport-level tests: the test drives the pipes itself, so Inline scheduling adds nothing there.</summary>
    public static TheoryData<TransportKind> ConnectionLevel => Select(
        TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxManaged, TransportKind.LinuxAio, TransportKind.LinuxZeroCopy,
        TransportKind.LinuxIoUring, TransportKind.LinuxIoUringZeroCopy, TransportKind.LinuxAdaptive);

    /// <summary>Host-level tests: every kind, Inline included.</summary>
    public static TheoryData<TransportKind> HostLevel => Select(HostLevelKinds);

    /// <summary>Host-level kinds whose apps may block a thread: all but the Inline ones, whose contract is that they never do.</summary>
    public static TheoryData<TransportKind> AllowBlocking => Select(HostLevelKinds.Where(kind => !kind.IsInline()).ToArray());

    /// <summary>For behaviour only the Linux transport has (its own options).</summary>
    public static TheoryData<TransportKind> LinuxOnly => Select(TransportKind.LinuxNative, TransportKind.LinuxManaged);

    /// <summary>
    /// The kind that is the transport's default configuration: the one whose <see cref="Configure"/> leaves every option of a
    /// new <see cref="LinuxTransportOptions"/> (and of its tuning) as it is, but the loop count. It follows the defaults, so a
    /// change of default scheduling mode or engine moves it without an edit here.
    /// </summary>
    public static TransportKind DefaultKind => s_defaultKind.Value;

    /// <summary>What <see cref="SelectionVariable"/> selects, in words, for the suite's log.</summary>
    public static string SelectionDescription => s_selected.Value is { } selected
        ? $"{SelectionVariable}={Environment.GetEnvironmentVariable(SelectionVariable)}: the shared theory data runs " +
          string.Join(", ", selected.Order().Select(kind => kind == DefaultKind ? $"{kind} (the default configuration)" : kind.ToString())) +
          " (a theory that has none of them keeps all of its kinds)"
        : $"{SelectionVariable} unset: every kind runs (the default configuration is {DefaultKind})";

    private static TransportKind[] HostLevelKinds =>
    [
        TransportKind.Sockets, TransportKind.LinuxNative, TransportKind.LinuxManaged, TransportKind.LinuxInline,
        TransportKind.LinuxInlineSpin, TransportKind.LinuxAio, TransportKind.LinuxImmediateSend, TransportKind.LinuxZeroCopy,
        TransportKind.LinuxIoUring, TransportKind.LinuxIoUringInline, TransportKind.LinuxIoUringZeroCopy,
        TransportKind.LinuxAdaptive, TransportKind.LinuxIoUringAdaptive,
    ];

    public static bool IsLinux(this TransportKind kind) => kind != TransportKind.Sockets;

    /// <summary>Applies the kind's defaults for tests: two loops, the engine and the scheduling mode it names.</summary>
    public static void Configure(this TransportKind kind, LinuxTransportOptions options)
    {
        options.ThreadCount = LinuxThreadCount;
        options.Tuning.UseNativeEngine = kind != TransportKind.LinuxManaged;
        options.ApplicationSchedulingMode = kind.IsAdaptive() ? ApplicationSchedulingMode.Adaptive
            : kind.IsInline() ? ApplicationSchedulingMode.Inline
            : ApplicationSchedulingMode.ThreadPool;
        options.IoBackend = kind switch
        {
            TransportKind.LinuxAio => IoBackend.EpollAio,
            _ when kind.UsesIoUring() => IoBackend.IoUring,
            _ => IoBackend.Epoll,
        };
        options.Tuning.DeferSend = kind != TransportKind.LinuxImmediateSend;

        // These test the loop's own send paths, which sends from the pool threads would bypass.
        options.Tuning.SendFromThreadPool = kind is not (TransportKind.LinuxAio or TransportKind.LinuxImmediateSend or TransportKind.LinuxIoUringZeroCopy);

        // Pool sends in both orders: the managed kind sends ahead of the batch, the others coalesce.
        options.Tuning.CoalesceThreadPoolSends = kind != TransportKind.LinuxManaged;

        options.ZeroCopySendThreshold = kind.SendsZeroCopy() ? 1024 : 0;
        options.Tuning.ZeroCopyWhenKernelCopies = kind.SendsZeroCopy();
        options.SpinBeforeSleepMicroseconds = kind == TransportKind.LinuxInlineSpin ? 200 : 0;
    }

    /// <summary>True for the kinds on the io_uring engine.</summary>
    public static bool UsesIoUring(this TransportKind kind) => kind is TransportKind.LinuxIoUring or TransportKind.LinuxIoUringInline or TransportKind.LinuxIoUringZeroCopy or TransportKind.LinuxIoUringAdaptive;

    /// <summary>True for the kinds with Adaptive scheduling.</summary>
    public static bool IsAdaptive(this TransportKind kind) => kind is TransportKind.LinuxAdaptive or TransportKind.LinuxIoUringAdaptive;

    /// <summary>True for the kinds whose loops run application continuations while they are quick, and move when one blocks.</summary>
    public static bool RunsContinuationsOnLoop(this TransportKind kind) => kind.IsAdaptive();

    /// <summary>True for the kinds with zero-copy sends on (from 1 KiB, kept on over loopback).</summary>
    public static bool SendsZeroCopy(this TransportKind kind) => kind is TransportKind.LinuxZeroCopy or TransportKind.LinuxIoUringZeroCopy;

    /// <summary>True for the kinds that run the app on the loop thread.</summary>
    public static bool IsInline(this TransportKind kind) => kind is TransportKind.LinuxInline or TransportKind.LinuxInlineSpin or TransportKind.LinuxIoUringInline;

    /// <summary>
    /// A native run that silently fell back to the managed engine would test the managed engine twice,
    /// so a kind that names the native engine requires that the library actually loaded.
    /// </summary>
    public static void AssertEngineAvailable(this TransportKind kind)
    {
        if (kind is not (TransportKind.Sockets or TransportKind.LinuxManaged))
        {
            Assert.True(
                NativeEngine.IsSupported,
                $"{kind} needs libktl_native.so beside the test assembly ({AppContext.BaseDirectory}); it was not loaded, so this run would only repeat the managed engine.");
        }
    }

    /// <summary>
    /// After a bind: the loops run the engine the kind names, and io_submit when it names AIO (an AIO
    /// kind whose io_setup silently failed would only repeat the readv/writev run).
    /// </summary>
    public static void AssertLoopsAsConfigured(this TransportKind kind, IConnectionListenerFactory factory)
    {
        if (!kind.IsLinux())
        {
            return;
        }

        var loops = Assert.IsType<LinuxTransportFactory>(factory).Loops;
        Assert.NotEmpty(loops);
        foreach (var loop in loops)
        {
            Assert.Equal(kind != TransportKind.LinuxManaged, loop.Engine.IsNative);
            Assert.Equal(kind == TransportKind.LinuxAio, loop.Engine.UsesAio);
            Assert.Equal(
                kind.UsesIoUring() ? IoBackend.IoUring : kind == TransportKind.LinuxAio ? IoBackend.EpollAio : IoBackend.Epoll,
                loop.Engine.Backend);

            // An Adaptive kind that silently scheduled as ThreadPool would only repeat LinuxNative.
            Assert.Equal(kind.RunsContinuationsOnLoop(), loop.RunsContinuations);

            // Without SENDMSG_ZC (Linux 6.2) the kind would only repeat LinuxZeroCopy's sendmsg(MSG_ZEROCOPY).
            Assert.Equal(kind == TransportKind.LinuxIoUringZeroCopy, kind.SendsZeroCopy() && loop.Engine.SendsZeroCopyAsOps);
        }
    }

    /// <summary>
    /// The kinds of <paramref name="kinds"/> that <see cref="SelectionVariable"/> selects. A theory none of whose kinds is
    /// selected keeps them all, so that no test drops out of a limited run unseen.
    /// </summary>
    private static TheoryData<TransportKind> Select(params TransportKind[] kinds)
    {
        var selected = s_selected.Value;
        var kept = selected is null ? kinds : kinds.Where(selected.Contains).ToArray();
        return new(kept.Length > 0 ? kept : kinds);
    }

    private static HashSet<TransportKind>? ParseSelection(string? value)
    {
        if (string.IsNullOrWhiteSpace(value))
        {
            return null;
        }

        var selected = new HashSet<TransportKind>();
        foreach (var name in value.Split(',', StringSplitOptions.TrimEntries | StringSplitOptions.RemoveEmptyEntries))
        {
            if (name.Equals("Default", StringComparison.OrdinalIgnoreCase))
            {
                selected.Add(DefaultKind);
            }
            else if (!name.All(char.IsAsciiLetter) || !Enum.TryParse(name, ignoreCase: true, out TransportKind kind))
            {
                throw new InvalidOperationException(
                    $"{SelectionVariable}='{value}' names '{name}', which is no transport kind: expected a comma-separated list of " +
                    $"Default, {string.Join(", ", Enum.GetNames<TransportKind>())}.");
            }
            else
            {
                selected.Add(kind);
            }
        }

        return selected;
    }

    private static TransportKind FindDefaultKind()
    {
        var defaults = new LinuxTransportOptions();
        var matches = Enum.GetValues<TransportKind>().Where(kind => kind.IsLinux()).Where(kind =>
        {
            var options = new LinuxTransportOptions();
            kind.Configure(options);
            return ConfiguredAlike(options, defaults);
        }).ToList();
        return matches.Count == 1
            ? matches[0]
            : throw new InvalidOperationException(
                $"LinuxTransportOptions' defaults (ApplicationSchedulingMode {defaults.ApplicationSchedulingMode}, IoBackend {defaults.IoBackend}) " +
                $"match {matches.Count} transport kinds ({string.Join(", ", matches)}); exactly one kind's Configure must leave the defaults as they are.");
    }

    /// <summary>
    /// Whether two options configure the same transport: every settable public option and tuning alike, but the loop count,
    /// with <see cref="IoBackend.Auto"/> taken as the engine it picks where io_uring works (<see cref="EngineChoice.MayUseIoUring"/>).
    /// </summary>
    private static bool ConfiguredAlike(LinuxTransportOptions a, LinuxTransportOptions b)
    {
        static IoBackend Engine(LinuxTransportOptions options) => EngineChoice.MayUseIoUring(options) ? IoBackend.IoUring
            : options.IoBackend == IoBackend.Auto ? IoBackend.Epoll
            : options.IoBackend;

        static bool Alike(object x, object y) => x.GetType().GetProperties(BindingFlags.Public | BindingFlags.Instance)
            .Where(p => p.CanRead && p.CanWrite && p.Name is not (nameof(LinuxTransportOptions.ThreadCount) or nameof(LinuxTransportOptions.IoBackend)))
            .All(p => Equals(p.GetValue(x), p.GetValue(y)));

        return Engine(a) == Engine(b) && Alike(a, b) && Alike(a.Tuning, b.Tuning);
    }
}
