using System.Collections.Concurrent;
using System.Net;
using System.Net.Sockets;
using Kestrel.Transport.Linux.Hosting;
using Kestrel.Transport.Linux.Tests.Infrastructure;
using Microsoft.AspNetCore.Builder;
using Microsoft.AspNetCore.Connections;
using Microsoft.AspNetCore.Connections.Features;
using Microsoft.AspNetCore.Hosting;
using Microsoft.AspNetCore.Http;
using Microsoft.AspNetCore.Server.Kestrel.Transport.Sockets;
using Microsoft.Extensions.DependencyInjection;
using Microsoft.Extensions.Logging;
using Microsoft.Extensions.Logging.Abstractions;
using Microsoft.Extensions.Options;

namespace Kestrel.Transport.Linux.Tests.Hosting;

/// <summary>
/// One server, two transports: an endpoint that another transport marks as its own (an <see cref="IPEndPoint"/>
/// subclass, as Kestrel 11's DirectTls marks the endpoints it serves with TLS) is served by that transport, whichever
/// of the two was registered last; plain endpoints are served here.
/// </summary>
public sealed class OtherTransportTests(ITestOutputHelper output)
{
    [Theory]
    [InlineData(true)]
    [InlineData(false)]
    public async Task An_endpoint_marked_by_another_transport_is_served_by_it_in_either_registration_order(bool otherRegisteredFirst)
    {
        var other = new MarkingTransportFactory();
        var builder = WebApplication.CreateSlimBuilder();
        builder.Logging.ClearProviders();
        builder.Logging.AddProvider(new TestOutputLoggerProvider(output, LogLevel.Warning));
        builder.WebHost.UseKestrel(k =>
        {
            k.Listen(IPAddress.Loopback, 0);
            k.Listen(new MarkedEndPoint(IPAddress.Loopback, 0));
        });

        // Kestrel asks the factory registered last first: with the other one first, ours is asked first for both endpoints.
        if (otherRegisteredFirst)
        {
            builder.Services.AddSingleton<IConnectionListenerFactory>(other);
        }

        builder.WebHost.UseLinuxTransport(o => o.ThreadCount = 1);
        if (!otherRegisteredFirst)
        {
            builder.Services.AddSingleton<IConnectionListenerFactory>(other);
        }

        await using var app = builder.Build();
        // Who accepted the connection: the other transport's mark, or else the connection id (ours are L and 16 hex digits).
        app.Run(static c => c.Response.WriteAsync(
            c.Features.Get<IConnectionItemsFeature>()?.Items.TryGetValue(MarkingTransportFactory.ItemKey, out var by) == true ? (string)by! : c.Connection.Id));
        await app.StartAsync().WaitAsync(TestTimeouts.Default);

        var marked = Assert.Single(other.Bound);
        Assert.IsType<MarkedEndPoint>(marked);
        int plainPort = Assert.Single(app.Urls.Select(u => new Uri(u).Port), p => p != ((IPEndPoint)marked).Port);

        using var client = new HttpClient { Timeout = TestTimeouts.Default };
        Assert.Equal("other", await client.GetStringAsync(new Uri($"http://127.0.0.1:{((IPEndPoint)marked).Port}/")));
        Assert.Matches("^L[0-9A-F]{16}$", await client.GetStringAsync(new Uri($"http://127.0.0.1:{plainPort}/")));
        Assert.Equal(1, other.Accepted);
        await app.StopAsync().WaitAsync(TestTimeouts.Default);
    }

    [Fact]
    public void CanBind_takes_exactly_its_endpoint_types_and_no_subclass()
    {
        var factory = new LinuxTransportFactory(Options.Create(new LinuxTransportOptions()), NullLoggerFactory.Instance);
        Assert.True(factory.CanBind(new IPEndPoint(IPAddress.Loopback, 0)));
        Assert.True(factory.CanBind(new UnixDomainSocketEndPoint("/tmp/ktl-canbind.sock")));
        Assert.True(factory.CanBind(new FileHandleEndPoint(3, FileHandleType.Auto)));
        Assert.False(factory.CanBind(new MarkedEndPoint(IPAddress.Loopback, 0)));
        Assert.False(factory.CanBind(new DnsEndPoint("localhost", 80)));
    }

    /// <summary>The other transport's mark: an <see cref="IPEndPoint"/> that only it may serve.</summary>
    private sealed class MarkedEndPoint(IPAddress address, int port) : IPEndPoint(address, port)
    {
    }

    /// <summary>
    /// Another transport that serves only <see cref="MarkedEndPoint"/>: Kestrel's Sockets transport underneath, with an
    /// item on each connection that tells the app who accepted it.
    /// </summary>
    private sealed class MarkingTransportFactory : IConnectionListenerFactory, IConnectionListenerFactorySelector
    {
        public const string ItemKey = "accepted-by";

        private readonly SocketTransportFactory _sockets = new(Options.Create(new SocketTransportOptions()), NullLoggerFactory.Instance);
        private int _accepted;

        public ConcurrentQueue<EndPoint> Bound { get; } = new();

        public int Accepted => Volatile.Read(ref _accepted);

        public bool CanBind(EndPoint endpoint) => endpoint is MarkedEndPoint;

        public async ValueTask<IConnectionListener> BindAsync(EndPoint endpoint, CancellationToken cancellationToken = default)
        {
            var marked = Assert.IsType<MarkedEndPoint>(endpoint);
            var listener = await _sockets.BindAsync(new IPEndPoint(marked.Address, marked.Port), cancellationToken);
            var bound = new MarkedEndPoint(marked.Address, ((IPEndPoint)listener.EndPoint).Port);
            Bound.Enqueue(bound);
            return new Listener(this, listener, bound);
        }

        private sealed class Listener(MarkingTransportFactory owner, IConnectionListener inner, EndPoint endPoint) : IConnectionListener
        {
            public EndPoint EndPoint { get; } = endPoint;

            public async ValueTask<ConnectionContext?> AcceptAsync(CancellationToken cancellationToken = default)
            {
                var connection = await inner.AcceptAsync(cancellationToken);
                if (connection is not null)
                {
                    connection.Items[ItemKey] = "other";
                    Interlocked.Increment(ref owner._accepted);
                }

                return connection;
            }

            public ValueTask UnbindAsync(CancellationToken cancellationToken = default) => inner.UnbindAsync(cancellationToken);

            public ValueTask DisposeAsync() => inner.DisposeAsync();
        }
    }
}
