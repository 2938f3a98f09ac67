using System.Buffers;
using System.Net;
using LibuvComparator.Interop;
using Microsoft.AspNetCore.Connections;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Options;

namespace LibuvComparator.Internal;

/// <summary>
/// Kestrel's entry point: starts the loops on the first bind and binds IP endpoints onto all of
/// them. The loops live until the factory is disposed (with the host's service provider).
/// </summary>
internal sealed class LibuvTransportFactory : IConnectionListenerFactory, IConnectionListenerFactorySelector, IAsyncDisposable, IDisposable
{
    private readonly LibuvComparatorOptions _options;
    private readonly ILogger _logger;
    private readonly IMemoryPoolFactory<byte>? _memoryPoolFactory;
    private readonly Lock _gate = new();
    private LibuvLoop[]? _loops;
    private bool _disposed;

    public LibuvTransportFactory(IOptions<LibuvComparatorOptions> options, ILoggerFactory loggerFactory, IMemoryPoolFactory<byte>? memoryPoolFactory = null)
    {
        ArgumentNullException.ThrowIfNull(options);
        ArgumentNullException.ThrowIfNull(loggerFactory);

        _options = options.Value;
        ArgumentOutOfRangeException.ThrowIfLessThan(_options.ThreadCount, 1, $"{nameof(LibuvComparatorOptions)}.{nameof(LibuvComparatorOptions.ThreadCount)}");
        ArgumentOutOfRangeException.ThrowIfLessThan(_options.Backlog, 1, $"{nameof(LibuvComparatorOptions)}.{nameof(LibuvComparatorOptions.Backlog)}");
        ArgumentOutOfRangeException.ThrowIfNegative(_options.MaxReadBufferSize ?? 0, $"{nameof(LibuvComparatorOptions)}.{nameof(LibuvComparatorOptions.MaxReadBufferSize)}");
        ArgumentOutOfRangeException.ThrowIfNegative(_options.MaxWriteBufferSize ?? 0, $"{nameof(LibuvComparatorOptions)}.{nameof(LibuvComparatorOptions.MaxWriteBufferSize)}");

        _logger = loggerFactory.CreateLogger(ComparatorLog.Category);
        _memoryPoolFactory = memoryPoolFactory;
    }

    /// <summary>The running loops, for tests; empty before the first bind.</summary>
    internal IReadOnlyList<LibuvLoop> Loops
    {
        get
        {
            lock (_gate)
            {
                return _loops ?? [];
            }
        }
    }

    public bool CanBind(EndPoint endpoint) => endpoint is IPEndPoint;

    public async ValueTask<IConnectionListener> BindAsync(EndPoint endpoint, CancellationToken cancellationToken = default)
    {
        ArgumentNullException.ThrowIfNull(endpoint);
        if (endpoint is not IPEndPoint ip)
        {
            throw new NotSupportedException($"The libuv comparator binds IP endpoints only, not {endpoint.GetType().Name} '{endpoint}'.");
        }

        cancellationToken.ThrowIfCancellationRequested();
        return await LibuvConnectionListener.BindAsync(EnsureLoops(), ip, _options, _logger);
    }

    private LibuvLoop[] EnsureLoops()
    {
        lock (_gate)
        {
            ObjectDisposedException.ThrowIf(_disposed, this);
            if (_loops is not null)
            {
                return _loops;
            }

            Uv.EnsureAvailable();
            var loops = new List<LibuvLoop>(_options.ThreadCount);
            try
            {
                for (int i = 0; i < _options.ThreadCount; i++)
                {
                    var pool = _memoryPoolFactory?.Create(new MemoryPoolOptions { Owner = "LibuvComparator" });
                    loops.Add(new LibuvLoop(i, _options, pool ?? MemoryPool<byte>.Shared, ownsPool: pool is not null, _logger));
                }
            }
            catch
            {
                // Loops never started: starting and stopping them at once closes their handles and frees them.
                foreach (var loop in loops)
                {
                    loop.Start();
                    loop.Stop();
                    loop.Join();
                }

                throw;
            }

            foreach (var loop in loops)
            {
                loop.Start();
            }

            _loops = [.. loops];
            ComparatorLog.LoopsStarted(_logger, _loops.Length, Uv.VersionString());
            return _loops;
        }
    }

    public async ValueTask DisposeAsync()
    {
        LibuvLoop[]? loops;
        lock (_gate)
        {
            if (_disposed)
            {
                return;
            }

            _disposed = true;
            loops = _loops;
            _loops = null;
        }

        if (loops is null)
        {
            return;
        }

        foreach (var loop in loops)
        {
            loop.Stop();
        }

        await Task.WhenAll(loops.Select(static l => l.Stopped));
        foreach (var loop in loops)
        {
            loop.Join();
        }
    }

    public void Dispose() => DisposeAsync().AsTask().GetAwaiter().GetResult();
}
