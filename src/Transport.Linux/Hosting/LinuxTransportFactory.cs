using System.Buffers;
using System.Diagnostics.Metrics;
using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Diagnostics;
using Kestrel.Transport.Linux.Listening;
using Kestrel.Transport.Linux.Loop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Hosting;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Options;

namespace Kestrel.Transport.Linux.Hosting;

/// <summary>
/// Kestrel's entry point into the transport: binds endpoints onto one shared group of event loops.
/// </summary>
internal sealed class LinuxTransportFactory : IConnectionListenerFactory, IConnectionListenerFactorySelector, IAsyncDisposable, IDisposable
{
    private readonly LinuxTransportOptions _options;
    private readonly ILogger _logger;
    private readonly IMemoryPoolFactory<byte> _memoryPoolFactory;
    private readonly TransportMetrics _metrics;
    private readonly Lock _gate = new();
    private readonly List<EventLoopGroup> _groups = [];
    private readonly List<EndPoint> _bound = [];
    private EventLoopGroup? _current;
    private bool _disposed;

    public LinuxTransportFactory(
        IOptions<LinuxTransportOptions> options,
        ILoggerFactory loggerFactory,
        IMemoryPoolFactory<byte>? memoryPoolFactory = null,
        IMeterFactory? meterFactory = null,
        IHostApplicationLifetime? lifetime = null)
    {
        ArgumentNullException.ThrowIfNull(options);
        ArgumentNullException.ThrowIfNull(loggerFactory);

        // Reading Value runs the registered validators; validate here as well for direct construction.
        _options = options.Value;
        var failures = _options.Validate().ToList();
        if (failures.Count > 0)
        {
            throw new OptionsValidationException(nameof(LinuxTransportOptions), typeof(LinuxTransportOptions), failures);
        }

        _logger = loggerFactory.CreateLogger(TransportLog.Category);
        _memoryPoolFactory = memoryPoolFactory ?? SharedArrayPoolFactory.Instance;
        _metrics = new TransportMetrics(meterFactory);
        TransportLog.Features(_logger, System.Runtime.InteropServices.RuntimeInformation.OSDescription, KernelFeatures.For(_options));

        // Once Kestrel has bound every endpoint: the one line at the default log level that says the transport is
        // active, with its loops, its engine and what it serves.
        lifetime?.ApplicationStarted.Register(static s => ((LinuxTransportFactory)s!).LogServing(), this);
    }

    /// <summary>The loops of the current group, for diagnostics and tests; empty before the first bind.</summary>
    internal IReadOnlyList<EventLoop> Loops
    {
        get
        {
            lock (_gate)
            {
                return _current?.Loops ?? [];
            }
        }
    }

    /// <summary>The threads that hold the current group's loops with Adaptive scheduling (tests); null otherwise.</summary>
    internal LoopThreads? LoopThreads
    {
        get
        {
            lock (_gate)
            {
                return _current?.Threads;
            }
        }
    }

    /// <summary>
    /// Exactly the endpoint types this transport serves, never a subclass: another transport marks the endpoints it alone
    /// may serve with a subclass (Kestrel 11's DirectTls terminates TLS on <c>DirectTlsEndpoint : IPEndPoint</c>), and Kestrel
    /// asks the last-registered factory first, so a looser check would serve such an endpoint here, without its TLS.
    /// </summary>
    public bool CanBind(EndPoint endpoint)
    {
        ArgumentNullException.ThrowIfNull(endpoint);
        var type = endpoint.GetType();
        return type == typeof(IPEndPoint) || type == typeof(UnixDomainSocketEndPoint) || type == typeof(FileHandleEndPoint);
    }

    public async ValueTask<IConnectionListener> BindAsync(EndPoint endpoint, CancellationToken cancellationToken = default)
    {
        ArgumentNullException.ThrowIfNull(endpoint);
        var group = AcquireGroup();
        try
        {
            var listener = await LinuxConnectionListener.BindAsync(group, endpoint, _options, _logger);
            lock (_gate)
            {
                _bound.Add(listener.EndPoint);
            }

            return listener;
        }
        catch
        {
            group.Release();
            throw;
        }
    }

    private EventLoopGroup AcquireGroup()
    {
        lock (_gate)
        {
            ObjectDisposedException.ThrowIf(_disposed, this);
            if (_current is null || !_current.TryAcquire())
            {
                _current = new EventLoopGroup(_options, _memoryPoolFactory, _logger, _metrics);
                _groups.Add(_current);
                _current.TryAcquire();
                TransportLog.LoopsStarted(_logger, _options.ThreadCount, _options.ApplicationSchedulingMode, _current.Loops[0].Engine.Name);
            }

            return _current;
        }
    }

    private void LogServing()
    {
        string endPoints;
        IReadOnlyList<EventLoop> loops;
        lock (_gate)
        {
            if (_bound.Count == 0 || _current is null)
            {
                return;
            }

            endPoints = string.Join(", ", _bound.Select(static e => e is UnixDomainSocketEndPoint ? $"unix:{e}" : e.ToString()));
            loops = _current.Loops;
        }

        TransportLog.Serving(_logger, endPoints, loops.Count, string.Join(" / ", loops.Select(static l => l.Engine.Name).Distinct()), _options.ApplicationSchedulingMode);
    }

    public async ValueTask DisposeAsync()
    {
        EventLoopGroup[] groups;
        lock (_gate)
        {
            if (_disposed)
            {
                return;
            }

            _disposed = true;
            groups = [.. _groups];
            _groups.Clear();
            _current = null;
        }

        foreach (var group in groups)
        {
            await group.StopAsync();
        }

        _metrics.Dispose();
    }

    public void Dispose() => DisposeAsync().AsTask().GetAwaiter().GetResult();

    /// <summary>For hosts without Kestrel's pool factory (direct use in tests): pools over the shared ArrayPool.</summary>
    private sealed class SharedArrayPoolFactory : IMemoryPoolFactory<byte>
    {
        public static readonly SharedArrayPoolFactory Instance = new();

        public MemoryPool<byte> Create(MemoryPoolOptions? options = null) => MemoryPool<byte>.Shared;
    }
}
