using System.Net;
using Kestrel.Transport.Linux.Hosting;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Options;

namespace Kestrel.Transport.Linux.Tests.Infrastructure;

/// <summary>The knobs a transport-level test may turn; each maps onto the same-named option of both transports.</summary>
internal sealed class TransportSettings
{
    public long? MaxReadBufferSize { get; set; } = 1024 * 1024;

    public long? MaxWriteBufferSize { get; set; } = 64 * 1024;

    /// <summary>Linux only.</summary>
    public int ThreadCount { get; set; } = Transports.LinuxThreadCount;

    /// <summary>Linux only: applied after everything else.</summary>
    public Action<LinuxTransportOptions>? Linux { get; set; }

    /// <summary>Sockets only: applied after everything else.</summary>
    public Action<SocketTransportOptions>? Sockets { get; set; }
}

/// <summary>
/// One transport factory of a given kind, with a diagnostic memory pool, and everything it bound and
/// accepted, so a test can end with <see cref="StopAsync"/>: dispose in Kestrel's order and check that every
/// block came back. <see cref="DisposeAsync"/> is the cleanup for a test that failed before that.
/// </summary>
internal sealed class TestTransport : IAsyncDisposable
{
    private readonly IConnectionListenerFactory _factory;
    private readonly IAsyncDisposable _owner;
    private readonly ILoggerFactory? _ownedLoggerFactory;
    private readonly List<IConnectionListener> _listeners = [];
    private readonly List<ConnectionContext> _connections = [];
    private bool _stopped;

    private TestTransport(TransportKind kind, IConnectionListenerFactory factory, IAsyncDisposable owner, ILoggerFactory? ownedLoggerFactory, DiagnosticMemoryPoolFactory memoryPool)
    {
        Kind = kind;
        _factory = factory;
        _owner = owner;
        _ownedLoggerFactory = ownedLoggerFactory;
        MemoryPool = memoryPool;
    }

    public TransportKind Kind { get; }

    public DiagnosticMemoryPoolFactory MemoryPool { get; }

    public IConnectionListenerFactory Factory => _factory;

    public static TestTransport Create(TransportKind kind, ITestOutputHelper output, Action<TransportSettings>? configure = null)
    {
        kind.AssertEngineAvailable();
        var settings = new TransportSettings();
        configure?.Invoke(settings);
        var memoryPool = new DiagnosticMemoryPoolFactory();

        if (kind == TransportKind.Sockets)
        {
            var services = new ServiceCollection();
            services.AddLogging(logging => logging.SetMinimumLevel(LogLevel.Information).AddProvider(new TestOutputLoggerProvider(output)));
            new ServiceCollectionWebHostBuilder(services).UseSockets(options =>
            {
                options.MaxReadBufferSize = settings.MaxReadBufferSize;
                options.MaxWriteBufferSize = settings.MaxWriteBufferSize;
                settings.Sockets?.Invoke(options);
            });
            services.AddSingleton<IMemoryPoolFactory<byte>>(memoryPool);
            var provider = services.BuildServiceProvider();
            var factory = provider.GetServices<IConnectionListenerFactory>().Last();
            return new TestTransport(kind, factory, provider, ownedLoggerFactory: null, memoryPool);
        }

        var options = new LinuxTransportOptions();
        kind.Configure(options);
        options.ThreadCount = settings.ThreadCount;
        options.MaxReadBufferSize = settings.MaxReadBufferSize;
        options.MaxWriteBufferSize = settings.MaxWriteBufferSize;
        settings.Linux?.Invoke(options);
        var loggerFactory = TestOutputLoggerProvider.CreateFactory(output);
        var linux = new LinuxTransportFactory(Options.Create(options), loggerFactory, memoryPool);
        return new TestTransport(kind, linux, linux, loggerFactory, memoryPool);
    }

    public async Task<IConnectionListener> BindAsync(EndPoint endPoint)
    {
        var listener = await _factory.BindAsync(endPoint).AsTask().WaitAsync(TestTimeouts.Default);
        if (_factory is LinuxTransportFactory)
        {
            Kind.AssertLoopsAsConfigured(_factory);
        }
        lock (_listeners)
        {
            _listeners.Add(listener);
        }

        return listener;
    }

    /// <summary>Accepts one connection, failing (not hanging) when none arrives or the listener ended.</summary>
    public async Task<ConnectionContext> AcceptAsync(IConnectionListener listener, TimeSpan? timeout = null)
    {
        var connection = await listener.AcceptAsync().AsTask().WaitAsync(timeout ?? TestTimeouts.Default);
        Assert.True(connection is not null, "AcceptAsync returned null: the listener ended while a connection was expected.");
        Track(connection);
        return connection;
    }

    public void Track(ConnectionContext connection)
    {
        lock (_connections)
        {
            _connections.Add(connection);
        }
    }

    /// <summary>Disposes one connection now; <see cref="StopAsync"/> will not dispose it again.</summary>
    public async Task DisposeConnectionAsync(ConnectionContext connection)
    {
        lock (_connections)
        {
            _connections.Remove(connection);
        }

        await connection.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
    }

    /// <summary>
    /// Shuts down in Kestrel's order (unbind, dispose connections, dispose listeners, dispose the factory)
    /// and then requires every memory block back. <paramref name="expectRentals"/> is false only for tests
    /// that never move data, where no block need ever have been rented.
    /// </summary>
    public async Task StopAsync(bool expectRentals = true)
    {
        await ShutDownAsync();
        if (expectRentals)
        {
            Assert.True(MemoryPool.TotalRented > 0, "The transport never rented a block from the test's memory pool factory, so the pool check would prove nothing.");
        }

        MemoryPool.AssertAllReturned();
    }

    public async ValueTask DisposeAsync()
    {
        if (!_stopped)
        {
            try
            {
                await ShutDownAsync();
            }
            catch (Exception ex) when (ex is not OutOfMemoryException)
            {
                // The test already failed; its own exception is the one to report.
            }
        }
    }

    private async Task ShutDownAsync()
    {
        _stopped = true;
        IConnectionListener[] listeners;
        ConnectionContext[] connections;
        lock (_listeners)
        {
            listeners = [.. _listeners];
            _listeners.Clear();
        }

        lock (_connections)
        {
            connections = [.. _connections];
            _connections.Clear();
        }

        foreach (var listener in listeners)
        {
            await listener.UnbindAsync().AsTask().WaitAsync(TestTimeouts.Default);
        }

        await Task.WhenAll(connections.Select(c => c.DisposeAsync().AsTask())).WaitAsync(TestTimeouts.Default);

        foreach (var listener in listeners)
        {
            await listener.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        }

        await _owner.DisposeAsync().AsTask().WaitAsync(TestTimeouts.Default);
        _ownedLoggerFactory?.Dispose();
    }
}
