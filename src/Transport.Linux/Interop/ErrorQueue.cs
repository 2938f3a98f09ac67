using System.Runtime.InteropServices;

namespace Kestrel.Transport.Linux.Interop;

/// <summary>
/// A socket's error queue (recvmsg with MSG_ERRQUEUE, ip(7) and ipv6(7) IP_RECVERR), which is where the
/// kernel reports MSG_ZEROCOPY sends done (msg_zerocopy.rst).
/// </summary>
internal static unsafe class ErrorQueue
{
    // The records that carry MSG_ZEROCOPY completions (linux/errqueue.h, linux/in.h, linux/in6.h).
    public const int SOL_IP = 0;
    public const int IP_RECVERR = 11;
    public const int SOL_IPV6 = 41;
    public const int IPV6_RECVERR = 25;
    public const byte SO_EE_ORIGIN_ZEROCOPY = 5;
    public const byte SO_EE_CODE_ZEROCOPY_COPIED = 1;

    /// <summary>Room for one cmsghdr and its sock_extended_err, with some to spare (the kernel may add an address).</summary>
    private const int ControlBytes = 128;

    /// <summary>
    /// Takes one record off the socket's error queue. Success with value 1 when it was a MSG_ZEROCOPY completion:
    /// the inclusive range of send ids it completes, and whether the kernel copied the data after all. Value 0 when
    /// the record was something else. EAGAIN when the queue is empty.
    /// </summary>
    public static SysResult ReadZeroCopyCompletion(int fd, out uint first, out uint last, out bool copied)
    {
        first = last = 0;
        copied = false;
        ulong* control = stackalloc ulong[ControlBytes / sizeof(ulong)];
        Socket.MessageHeader header = default;
        header.Control = control;
        header.ControlLength = ControlBytes;
        var result = SysResult.Of(Socket.recvmsg(fd, &header, Socket.MSG_ERRQUEUE));
        if (result.IsError)
        {
            return result;
        }

        byte* cmsg = (byte*)control;
        byte* end = cmsg + header.ControlLength;
        while (cmsg + sizeof(ControlMessageHeader) <= end)
        {
            var head = (ControlMessageHeader*)cmsg;
            if (head->Length < (nuint)(sizeof(ControlMessageHeader) + sizeof(ExtendedError)) || cmsg + head->Length > end)
            {
                break;
            }

            var error = (ExtendedError*)(cmsg + sizeof(ControlMessageHeader)); // CMSG_DATA: the header is already aligned
            if (((head->Level == SOL_IP && head->Type == IP_RECVERR) || (head->Level == SOL_IPV6 && head->Type == IPV6_RECVERR))
                && error->Origin == SO_EE_ORIGIN_ZEROCOPY && error->Errno == 0)
            {
                copied = (error->Code & SO_EE_CODE_ZEROCOPY_COPIED) != 0;
                first = error->Info;
                last = error->Data;
                return SysResult.FromNative(1);
            }

            // CMSG_NXTHDR: the next header starts at the next multiple of sizeof(size_t).
            cmsg += (head->Length + (nuint)(sizeof(nuint) - 1)) & ~(nuint)(sizeof(nuint) - 1);
        }

        return SysResult.Success;
    }

    /// <summary>struct cmsghdr (16 bytes on LP64).</summary>
    [StructLayout(LayoutKind.Sequential)]
    internal struct ControlMessageHeader
    {
        public nuint Length;   // cmsg_len
        public int Level;      // cmsg_level
        public int Type;       // cmsg_type
    }

    /// <summary>struct sock_extended_err (linux/errqueue.h, 16 bytes). For zero-copy, ee_info..ee_data is the completed id range.</summary>
    [StructLayout(LayoutKind.Sequential)]
    internal struct ExtendedError
    {
        public uint Errno;     // ee_errno
        public byte Origin;    // ee_origin
        public byte Type;      // ee_type
        public byte Code;      // ee_code
        public byte Pad;       // ee_pad
        public uint Info;      // ee_info
        public uint Data;      // ee_data
    }
}
